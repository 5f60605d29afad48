//! A step that lets go of its node while an upstream task works.
//!
//! A node's tool call that the server makes a task (the tasks extension)
//! can take minutes or hours. The node has nothing else to do meanwhile: its
//! one call is pending. So once the call has followed its task for
//! [`PARK_AFTER`], the step *parks*: the node run is stopped (its instance,
//! memory and step slot freed; the task is left running upstream), the step
//! follows the task on its own, and when the task ends the node runs again
//! from the start. That run gets the answers of its earlier calls and of the
//! call it waited on from memory, without making them again, and goes on
//! from there as if it had never stopped.
//!
//! The answers are kept only while they fit in [`MAX_REMEMBERED`]; a node
//! whose calls so far answered more keeps its instance, as before. So does a
//! node with more than one call in flight (`call-tools`): stopping it would
//! lose the others' answers. If the
//! node runs again differently (another call where an answered one was), its
//! calls from there on are made for real, and a warning says so.
//!
//! What is durable is what was before: the task's id is kept with the call's
//! idempotency key ([`crate::capability::TaskLedger`]), so after a crash the
//! step runs again and its call follows the same task.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::capability::{CapabilityError, JournalEntry, Parks, Replayed, Tape, Wait};

/// The journal names of the node's own waits start with this
/// ([`crate::capability::SLEEP`], [`crate::capability::WAIT_SIGNAL`]).
const WAIT_PREFIX: &str = "wf:";

/// How long a call follows its task with its node held before the step
/// parks: a task that ends sooner costs no second run of the node.
pub(super) const PARK_AFTER: Duration = Duration::from_secs(1);

/// The most bytes of answers (and their arguments) a node run keeps for a
/// run after parking: a durable node's journal limit.
pub(crate) const MAX_REMEMBERED: usize = 4 << 20;

/// A call of a node run and its answer.
#[derive(Debug, Clone)]
pub(super) struct Answered {
    seq: u32,
    name: String,
    /// As JSON text: a parked step keeps its answers for as long as it
    /// waits, and text is a tenth of the size of a JSON tree.
    arguments: String,
    result: Result<String, CapabilityError>,
    /// Not journaled yet: the call the parked run waited on, and how long
    /// that took.
    unrecorded: Option<Duration>,
    /// What the node read of its clocks and seed before this call.
    tape: Vec<TapeValue>,
}

/// One read of a durable node's clocks or random seed, as its journal keeps
/// it: `{"wall": ns}`, `{"mono": ns}` or `{"seed": "<hex>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TapeValue {
    Wall(u64),
    Mono(u64),
    Seed(String),
}

/// The most reads a node run journals between two of its calls; past it,
/// reads are live and not journaled (a warning says so), and a run after a
/// wait may read other values there.
const MAX_TAPE: usize = 4096;

/// A journaled tape (`CallRow::tape`), read back; `[]` for none or one
/// that does not parse.
pub(crate) fn tape_of(value: Option<&Value>) -> Vec<TapeValue> {
    value
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

impl Answered {
    /// A call or wait as the journal of an interrupted attempt has it: to
    /// be answered again, and journaled anew.
    pub fn journaled(
        seq: u32,
        name: String,
        arguments: Value,
        result: Result<Value, CapabilityError>,
        took: Duration,
        tape: Vec<TapeValue>,
    ) -> Answered {
        Answered {
            seq,
            name,
            arguments: arguments.to_string(),
            result: result.map(|v| v.to_string()),
            unrecorded: Some(took),
            tape,
        }
    }

    /// Whether a journal entry of this name is a wait of the node.
    pub fn is_wait(name: &str) -> bool {
        name.starts_with(WAIT_PREFIX)
    }
}

/// The call a parked step waits on, and what its node run had answered
/// before it.
#[derive(Debug)]
pub(super) struct Parked {
    pub seq: u32,
    /// `<connection>.<tool>`, or the wait's journal name.
    pub name: String,
    pub arguments: Value,
    /// When the call was made.
    pub since: Instant,
    /// What it waits on.
    pub on: ParkedOn,
    earlier: Vec<Answered>,
    /// What the node read of its clocks and seed since its call before.
    tape: Vec<TapeValue>,
}

/// What a parked step waits on.
#[derive(Debug)]
pub(super) enum ParkedOn {
    /// The upstream task of a call: the idempotency key it is kept under,
    /// its connection and id.
    Task {
        key: String,
        connection: String,
        task_id: String,
    },
    /// A wait of the node itself (`wf:node/durable`).
    Wait(Wait),
}

impl Parked {
    /// The answers a run of the node after this one is given: its earlier
    /// calls', and `result` for the call it waited on.
    pub fn answers(self, result: Result<Value, CapabilityError>) -> Vec<Answered> {
        // (A wait's pending entry was taken out when it parked, its reads
        // moved to `tape`.)
        let mut answers = self.earlier;
        answers.push(Answered {
            seq: self.seq,
            name: self.name,
            arguments: self.arguments.to_string(),
            result: result.map(|v| v.to_string()),
            unrecorded: Some(self.since.elapsed()),
            tape: self.tape,
        });
        answers
    }

    /// The answers a run of the node after this one is given when its wait
    /// was journaled before it let go (a sleep): its earlier calls' only.
    pub fn earlier(self) -> Vec<Answered> {
        self.earlier
    }
}

#[derive(Default)]
struct State {
    /// This run's calls and their answers, in order; `None` once past
    /// [`MAX_REMEMBERED`] (the run cannot park).
    answered: Option<Vec<Answered>>,
    bytes: usize,
    /// The call in flight: its seq, name, arguments and start.
    calling: Option<(u32, String, Value, Instant)>,
    /// Every call in flight, by seq: a node run that has more than one
    /// (`call-tools`) never parks, since the others' answers would be lost.
    in_flight: std::collections::BTreeSet<u32>,
    /// The task the call in flight made: its key, connection and id.
    task: Option<(String, String, String)>,
    /// The answers this run is given (from the run before it parked), by
    /// seq order; dropped at the first call that differs.
    replay: std::collections::VecDeque<Answered>,
    /// The wait the node asked to let go for (`wf:node/durable`).
    waiting: Option<(u32, String, Value, Wait)>,
    /// How a durable node's run differs from the one before it: its first
    /// call or wait that is not the journal's next.
    diverged: Option<String>,
    /// The reads of clocks and seed the run before made, still to be read
    /// again, in order.
    tape_replay: std::collections::VecDeque<TapeValue>,
    /// The reads since the node's last journaled call.
    tape_pending: Vec<TapeValue>,
    /// Past [`MAX_TAPE`] reads since the last call: not journaled.
    tape_full: bool,
    /// The largest monotonic reading given, and how far live readings are
    /// moved forward to stay past those of the run before.
    mono_floor: u64,
    mono_shift: Option<u64>,
}

/// One node run's calls, as far as parking needs them: what they answered,
/// the call in flight and the task it made.
pub(super) struct Parking {
    state: Mutex<State>,
    changed: tokio::sync::Notify,
    /// Set when the run parks: its call's task is left running.
    parked: AtomicBool,
    /// Which run and step, for the warning on a divergence.
    label: String,
    /// The run before this one waited (`wf:node/durable`): the node
    /// promises to run the same way each time, so a run that differs from
    /// its journal fails instead of going on live.
    durable: bool,
}

impl Parking {
    /// A node run given `replay`: the answers of the run before it, when
    /// that one parked (empty otherwise).
    pub fn new(label: String, replay: Vec<Answered>) -> Parking {
        Parking {
            durable: replay.iter().any(|a| Answered::is_wait(&a.name)),
            state: Mutex::new(State {
                answered: Some(Vec::new()),
                tape_replay: replay.iter().flat_map(|a| a.tape.iter().cloned()).collect(),
                replay: replay.into(),
                ..State::default()
            }),
            changed: tokio::sync::Notify::new(),
            parked: AtomicBool::new(false),
            label,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The answer for call `seq`, when the run before had it and the node
    /// makes the same call. A durable node's call that differs is answered
    /// with an error, as is every call after it, and the divergence is kept
    /// ([`Parking::diverged`]): its run fails rather than going on live.
    pub fn replayed(&self, seq: u32, name: &str, arguments: &Value) -> Option<Replayed> {
        let mut state = self.lock();
        if let Some(diverged) = &state.diverged {
            return Some(Replayed {
                result: Err(CapabilityError::Unavailable(diverged.clone())),
                record: None,
            });
        }
        let next = state.replay.front()?;
        // As the answer keeps it: JSON text (its keys in order).
        let made = arguments.to_string();
        if next.seq != seq || next.name != name || next.arguments != made {
            if self.durable {
                let diverged = format!(
                    "the node ran differently after it waited: call {seq}: the run made {} {}, this run made {name} {arguments}",
                    next.name, next.arguments
                );
                tracing::warn!(run = %self.label, seq, call = name, "{diverged}");
                state.diverged = Some(diverged.clone());
                return Some(Replayed {
                    result: Err(CapabilityError::Unavailable(diverged)),
                    record: None,
                });
            }
            tracing::warn!(run = %self.label, seq, call = name,
                "the node ran differently after its step parked; its calls from here on are made again");
            state.replay.clear();
            return None;
        }
        let answer = state.replay.pop_front()?;
        let replayed = Replayed {
            result: answer.result.as_deref().map(parsed).map_err(Clone::clone),
            record: answer.unrecorded,
        };
        if answer.unrecorded.is_none() {
            // Journaled before, with the reads before it: remembered here,
            // as `recorded` would.
            state.tape_pending.clear();
            state.tape_full = false;
            remember(&mut state, answer);
        }
        Some(replayed)
    }

    /// How a durable node's run differed from its journal: its first call
    /// that was not the journal's next, or the journal's calls it never
    /// made (asked once its run has ended).
    pub fn diverged(&self) -> Option<String> {
        let state = self.lock();
        if let Some(diverged) = &state.diverged {
            return Some(diverged.clone());
        }
        let missing = state.replay.front().filter(|_| self.durable)?;
        Some(format!(
            "the node ran differently after it waited: call {}: the run made {} {}, this run made no call",
            missing.seq, missing.name, missing.arguments
        ))
    }

    /// The node asks to let go of it at its call `seq` until `wait` is
    /// over ([`crate::capability::CallJournal::park`]).
    pub fn park(&self, seq: u32, name: &str, arguments: &Value, wait: Wait) -> Parks {
        let mut state = self.lock();
        if state.answered.is_none() {
            return Parks::TooBig(format!(
                "journal-limit: the node's calls so far answered more than {} MiB, the most a node that waits keeps to be answered again; wait before the large calls, or make them return less",
                MAX_REMEMBERED >> 20
            ));
        }
        state.waiting = Some((seq, name.to_owned(), arguments.clone(), wait));
        drop(state);
        self.changed.notify_one();
        Parks::Yes
    }

    /// Call `seq` is about to be made.
    pub fn calling(&self, seq: u32, name: &str, arguments: &Value) {
        let mut state = self.lock();
        state.in_flight.insert(seq);
        if state.answered.is_some() {
            state.calling = Some((seq, name.to_owned(), arguments.clone(), Instant::now()));
            state.task = None;
        }
    }

    /// A call ended (it is being journaled): remembered with its answer.
    /// Gives the reads of clocks and seed the node made before it, to be
    /// journaled with it.
    pub fn recorded(&self, entry: &JournalEntry) -> Vec<TapeValue> {
        let mut state = self.lock();
        state.in_flight.remove(&entry.seq);
        if state
            .calling
            .as_ref()
            .is_some_and(|(seq, ..)| *seq == entry.seq)
        {
            state.calling = None;
            state.task = None;
        }
        let tape = std::mem::take(&mut state.tape_pending);
        state.tape_full = false;
        if state.answered.is_none() {
            return tape;
        }
        let result = match entry.error_code {
            None => Ok(entry.result.to_string()),
            Some(_) => Err(CapabilityError::from_json(&entry.result["error"])),
        };
        let answer = Answered {
            seq: entry.seq,
            name: entry.name.clone(),
            arguments: entry.arguments.to_string(),
            result,
            unrecorded: None,
            tape: tape.clone(),
        };
        remember(&mut state, answer);
        tape
    }

    /// Keeps a read of the node's clocks or seed, to be journaled with its
    /// next call.
    fn read(state: &mut State, value: TapeValue, label: &str) {
        if state.tape_pending.len() >= MAX_TAPE {
            if !state.tape_full {
                tracing::warn!(run = %label,
                    "more than {MAX_TAPE} clock reads between two calls; later ones are not journaled, and a run after a wait may read others");
                state.tape_full = true;
            }
            return;
        }
        state.tape_pending.push(value);
    }

    /// The journal's next read, when it is of this kind (else the replay
    /// of reads ends: the node reads live from here).
    fn replay_read(state: &mut State, kind: fn(&TapeValue) -> bool) -> Option<TapeValue> {
        match state.tape_replay.front() {
            Some(next) if kind(next) => state.tape_replay.pop_front(),
            Some(_) => {
                state.tape_replay.clear();
                None
            }
            None => None,
        }
    }

    /// The call with `key` made a task.
    pub fn task_started(&self, key: &str, connection: &str, task_id: &str) {
        let mut state = self.lock();
        let seq = key.rsplit('/').next().and_then(|s| s.parse::<u32>().ok());
        if state
            .calling
            .as_ref()
            .is_some_and(|(calling, ..)| Some(*calling) == seq)
        {
            state.task = Some((key.to_owned(), connection.to_owned(), task_id.to_owned()));
            drop(state);
            self.changed.notify_one();
        }
    }

    /// Whether the run parked (its call's task is to be left running).
    pub fn keeps_task(&self) -> bool {
        self.parked.load(Ordering::Acquire)
    }

    /// Resolves once a call of the run has followed its task for `after`
    /// and is still waiting on it (and the run's answers fit): the run is
    /// then parked, and is to be stopped. Pending otherwise.
    pub async fn parks(&self, after: Duration) -> Parked {
        loop {
            let notified = self.changed.notified();
            // A wait of the node parks it at once.
            {
                let mut state = self.lock();
                if let Some((seq, name, arguments, wait)) = state.waiting.take() {
                    self.parked.store(true, Ordering::Release);
                    let mut earlier = state.answered.take().unwrap_or_default();
                    let mut tape = std::mem::take(&mut state.tape_pending);
                    // Its pending entry is not kept while it waits: its
                    // answer takes its place, with the reads before it.
                    if let Some(pending) = earlier.pop_if(|a| {
                        a.seq == seq
                            && a.result
                                .as_deref()
                                .is_ok_and(|r| crate::capability::is_pending(&parsed(r)))
                    }) {
                        tape.splice(0..0, pending.tape);
                    }
                    return Parked {
                        seq,
                        name,
                        arguments,
                        since: Instant::now(),
                        on: ParkedOn::Wait(wait),
                        earlier,
                        tape,
                    };
                }
            }
            let waiting = self.lock().task.clone();
            let Some(task) = waiting else {
                notified.await;
                continue;
            };
            tokio::select! {
                () = tokio::time::sleep(after) => {}
                // The node may wait meanwhile (a call of `call-tools`).
                () = notified => continue,
            }
            let mut state = self.lock();
            if state.task.as_ref() != Some(&task)
                || state.answered.is_none()
                || state.in_flight.len() > 1
            {
                continue;
            }
            let Some((seq, name, arguments, since)) = state.calling.clone() else {
                continue;
            };
            let (key, connection, task_id) = task;
            self.parked.store(true, Ordering::Release);
            return Parked {
                seq,
                name,
                arguments,
                since,
                on: ParkedOn::Task {
                    key,
                    connection,
                    task_id,
                },
                earlier: state.answered.take().unwrap_or_default(),
                tape: std::mem::take(&mut state.tape_pending),
            };
        }
    }
}

impl Tape for Parking {
    fn wall(&self, live: Duration) -> Duration {
        let mut state = self.lock();
        let now = match Self::replay_read(&mut state, |v| matches!(v, TapeValue::Wall(_))) {
            Some(TapeValue::Wall(ns)) => Duration::from_nanos(ns),
            _ => live,
        };
        let ns = u64::try_from(now.as_nanos()).unwrap_or(u64::MAX);
        Self::read(&mut state, TapeValue::Wall(ns), &self.label);
        now
    }

    fn monotonic(&self, live: u64) -> u64 {
        let mut state = self.lock();
        let now = match Self::replay_read(&mut state, |v| matches!(v, TapeValue::Mono(_))) {
            Some(TapeValue::Mono(ns)) => ns,
            _ => {
                // Live readings go on from the run before's last.
                let floor = state.mono_floor;
                let shift = *state.mono_shift.get_or_insert(floor.saturating_sub(live));
                live.saturating_add(shift).max(floor)
            }
        };
        state.mono_floor = state.mono_floor.max(now);
        Self::read(&mut state, TapeValue::Mono(now), &self.label);
        now
    }

    fn seed(&self, live: [u8; 32]) -> [u8; 32] {
        let mut state = self.lock();
        let replayed = Self::replay_read(&mut state, |v| matches!(v, TapeValue::Seed(_)));
        let seed = match replayed {
            Some(TapeValue::Seed(text)) => decode_seed(&text).unwrap_or(live),
            _ => live,
        };
        Self::read(&mut state, TapeValue::Seed(hex::encode(seed)), &self.label);
        seed
    }
}

/// A journaled seed (`{"seed": "<hex>"}`), read back; `None` for one
/// that is not 32 bytes of hex.
pub(crate) fn decode_seed(text: &str) -> Option<[u8; 32]> {
    hex::decode(text).ok()?.try_into().ok()
}

/// A kept answer's JSON text, read back (it was written from a value).
fn parsed(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// Keeps `answer` for a run after parking, unless the run's answers would
/// then exceed [`MAX_REMEMBERED`] (it can no longer park).
fn remember(state: &mut State, answer: Answered) {
    let size = answer.name.len()
        + answer.tape.len() * 24
        + answer.arguments.len()
        + match &answer.result {
            Ok(value) => value.len(),
            Err(e) => e.message().len(),
        };
    state.bytes += size;
    if state.bytes > MAX_REMEMBERED {
        state.answered = None;
        return;
    }
    // In seq order, which calls made at once may end out of; an answer
    // replaces the pending entry of its wait.
    if let Some(answered) = &mut state.answered {
        let at = answered.partition_point(|a| a.seq < answer.seq);
        match answered.get_mut(at) {
            Some(same) if same.seq == answer.seq => *same = answer,
            _ => answered.insert(at, answer),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A short [`PARK_AFTER`], in real time.
    const AFTER: Duration = Duration::from_millis(50);

    fn entry(seq: u32, name: &str, result: Value) -> JournalEntry {
        JournalEntry {
            seq,
            name: name.into(),
            arguments: json!({"n": seq}),
            error_code: None,
            duration: Duration::ZERO,
            result,
        }
    }

    #[tokio::test]
    async fn a_call_following_its_task_parks_with_the_answers_before_it() {
        let parking = Parking::new("r/s".into(), Vec::new());
        parking.calling(1, "c.one", &json!({"n": 1}));
        parking.recorded(&entry(1, "c.one", json!("first")));
        parking.calling(2, "c.long", &json!({"n": 2}));
        parking.task_started("r/s/0/2", "c", "t-1");
        let parked = parking.parks(AFTER).await;
        assert!(parking.keeps_task());
        let ParkedOn::Task { key, task_id, .. } = &parked.on else {
            panic!("parked on {:?}", parked.on)
        };
        assert_eq!(
            (parked.seq, task_id.as_str(), parked.name.as_str()),
            (2, "t-1", "c.long")
        );
        assert_eq!(key, "r/s/0/2");

        // The next run is answered both calls, and journals only the second.
        let again = Parking::new("r/s".into(), parked.answers(Ok(json!("done"))));
        let first = again.replayed(1, "c.one", &json!({"n": 1})).unwrap();
        assert_eq!(first.result, Ok(json!("first")));
        assert_eq!(first.record, None);
        let second = again.replayed(2, "c.long", &json!({"n": 2})).unwrap();
        assert_eq!(second.result, Ok(json!("done")));
        assert!(second.record.is_some());
        assert!(again.replayed(3, "c.more", &json!({})).is_none());
    }

    #[tokio::test]
    async fn a_task_that_ends_in_time_parks_nothing() {
        let parking = Parking::new("r/s".into(), Vec::new());
        parking.calling(1, "c.long", &json!({"n": 1}));
        parking.task_started("r/s/0/1", "c", "t-1");
        let parks = parking.parks(AFTER);
        let ended = async {
            tokio::time::sleep(AFTER / 2).await;
            parking.recorded(&entry(1, "c.long", json!("done")));
            tokio::time::sleep(AFTER * 10).await;
        };
        tokio::select! {
            _ = parks => panic!("parked after the call ended"),
            () = ended => {}
        }
        assert!(!parking.keeps_task());
    }

    #[test]
    fn a_node_that_runs_differently_makes_its_calls_again() {
        let answers = vec![Answered {
            seq: 1,
            name: "c.one".into(),
            arguments: json!({"n": 1}).to_string(),
            result: Ok(json!("first").to_string()),
            unrecorded: None,
            tape: vec![],
        }];
        let again = Parking::new("r/s".into(), answers);
        assert!(again.replayed(1, "c.other", &json!({"n": 1})).is_none());
        // And no later answer is used either.
        assert!(again.replayed(1, "c.one", &json!({"n": 1})).is_none());
    }

    #[tokio::test]
    async fn a_run_with_calls_made_at_once_never_parks_and_keeps_seq_order() {
        let parking = Parking::new("r/s".into(), Vec::new());
        parking.calling(1, "c.long", &json!({"n": 1}));
        parking.calling(2, "c.quick", &json!({"n": 2}));
        parking.calling(3, "c.other", &json!({"n": 3}));
        parking.task_started("r/s/0/3", "c", "t-3");
        parking.recorded(&entry(2, "c.quick", json!("two")));
        // Call 1 is still in flight: parking would lose its answer.
        tokio::select! {
            _ = parking.parks(AFTER) => panic!("parked with another call in flight"),
            () = tokio::time::sleep(AFTER * 10) => {}
        }
        // Once it ends, call 3 alone follows its task: the run parks, with
        // the answers in seq order.
        parking.recorded(&entry(1, "c.long", json!("one")));
        let parked = parking.parks(AFTER).await;
        assert_eq!(parked.seq, 3);
        let again = Parking::new("r/s".into(), parked.answers(Ok(json!("three"))));
        for (seq, name, answer) in [
            (1, "c.long", "one"),
            (2, "c.quick", "two"),
            (3, "c.other", "three"),
        ] {
            let replayed = again.replayed(seq, name, &json!({"n": seq})).unwrap();
            assert_eq!(replayed.result, Ok(json!(answer)));
        }
    }

    /// A node that waited promises to run the same way: a call that is not
    /// the journal's next is answered with an error (as is every call after
    /// it) and named, and so is a journaled call it never made.
    #[test]
    fn a_durable_node_that_runs_differently_is_stopped_and_told_where() {
        let slept = Answered {
            seq: 1,
            name: crate::capability::SLEEP.into(),
            arguments: json!({"ms": 5}).to_string(),
            result: Ok(json!({"until_ms": 0}).to_string()),
            unrecorded: None,
            tape: vec![],
        };
        let called = Answered {
            seq: 2,
            name: "c.one".into(),
            arguments: json!({"n": 2}).to_string(),
            result: Ok(json!("two").to_string()),
            unrecorded: None,
            tape: vec![],
        };
        let again = Parking::new("r/s".into(), vec![slept.clone(), called.clone()]);
        assert!(
            again
                .replayed(1, crate::capability::SLEEP, &json!({"ms": 5}))
                .is_some()
        );
        let other = again.replayed(2, "c.other", &json!({"n": 2})).unwrap();
        let expected = "the node ran differently after it waited: call 2: the run made c.one {\"n\":2}, this run made c.other {\"n\":2}";
        assert_eq!(
            other.result,
            Err(CapabilityError::Unavailable(expected.into()))
        );
        // No call past the difference is made live.
        let later = again.replayed(3, "c.more", &json!({})).unwrap();
        assert!(later.result.is_err());
        assert_eq!(again.diverged().as_deref(), Some(expected));

        let fewer = Parking::new("r/s".into(), vec![slept, called]);
        fewer.replayed(1, crate::capability::SLEEP, &json!({"ms": 5}));
        assert_eq!(
            fewer.diverged().as_deref(),
            Some(
                "the node ran differently after it waited: call 2: the run made c.one {\"n\":2}, this run made no call"
            )
        );
    }

    /// A node's reads of its clocks and seed are journaled with its next
    /// call (and with the wait it parks on), and a run after the park reads
    /// them again in order, whatever the clocks say now; past them it reads
    /// live, its monotonic clock never going back.
    #[tokio::test]
    async fn clock_and_seed_reads_are_read_again_after_a_park() {
        let first = Parking::new("r/s".into(), Vec::new());
        let wall = first.wall(Duration::from_millis(1_000));
        let seed = first.seed([7; 32]);
        let mono = first.monotonic(5_000);
        let tape = first.recorded(&entry(1, "c.one", json!("one")));
        assert_eq!(
            tape,
            [
                TapeValue::Wall(1_000_000_000),
                TapeValue::Seed("07".repeat(32)),
                TapeValue::Mono(5_000),
            ]
        );
        let late = first.wall(Duration::from_millis(2_000));
        assert_eq!(
            first.park(
                2,
                crate::capability::WAIT_SIGNAL,
                &json!({}),
                Wait::Signal {
                    name: "go".into(),
                    timeout: None
                }
            ),
            Parks::Yes
        );
        let parked = first.parks(AFTER).await;
        let again = Parking::new("r/s".into(), parked.answers(Ok(json!("payload"))));
        assert_eq!(again.wall(Duration::from_millis(9_000)), wall);
        assert_eq!(again.seed([9; 32]), seed);
        assert_eq!(again.monotonic(1), mono);
        assert!(again.replayed(1, "c.one", &json!({"n": 1})).is_some());
        // The read the run before made just before it waited, then live.
        assert_eq!(again.wall(Duration::from_millis(9_000)), late);
        assert_eq!(
            again.wall(Duration::from_millis(9_000)),
            Duration::from_millis(9_000)
        );
        assert!(again.monotonic(1) >= mono, "the monotonic clock went back");
    }

    #[tokio::test]
    async fn a_run_whose_answers_are_too_big_never_parks() {
        let parking = Parking::new("r/s".into(), Vec::new());
        parking.calling(1, "c.big", &json!({"n": 1}));
        parking.recorded(&entry(1, "c.big", json!("x".repeat(MAX_REMEMBERED))));
        parking.calling(2, "c.long", &json!({"n": 2}));
        parking.task_started("r/s/0/2", "c", "t-1");
        tokio::select! {
            _ = parking.parks(AFTER) => panic!("parked without its answers"),
            () = tokio::time::sleep(AFTER * 10) => {}
        }
    }
}
