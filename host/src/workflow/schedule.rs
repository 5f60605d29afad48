//! Cron schedules: `[[workflows.<name>.schedules]]` compiled, and the ticks
//! they are due at.
//!
//! A pattern is read in its time zone (the tz database, through
//! `chrono-tz`), and `croner` finds its ticks, with the daylight-saving
//! rules of cron (Vixie cron, as croner documents them): a fixed time that
//! falls in a spring-forward gap fires once, at the first time after the gap;
//! a fixed time in a repeated autumn hour fires once, at its first
//! occurrence; a pattern with a wildcard or step in its seconds, minutes or
//! hours fires on every matching wall-clock time, so the gap has no ticks and
//! the repeated hour has them twice.
//!
//! What a schedule has fired is kept in the store (`schedules`: the last
//! tick fired and its run), so a restarted host (or another worker) knows
//! which ticks it missed; see [`Schedule::due`].

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use serde::Serialize;
use serde_json::{Value, json};

use super::definition::DefinitionError;
use super::expr::Expr;
use crate::config::ScheduleConfig;

/// What a tick does while the schedule's last run still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// The tick fires no run.
    Skip,
    /// The tick waits, and fires when that run ends (ticks that come
    /// meanwhile join it: one run).
    Queue,
    /// The tick fires a run anyway.
    Allow,
}

/// Which missed ticks fire after downtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CatchUp {
    /// The latest missed tick, once.
    One,
    /// None: the next tick is the first after the host is back.
    None,
}

/// A compiled schedule of one workflow.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub workflow: String,
    pub name: String,
    pub pattern: String,
    pub timezone: Tz,
    cron: Cron,
    pub input: Option<Expr>,
    pub overlap: Overlap,
    pub catch_up: CatchUp,
}

/// The tick a schedule is due at now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    /// Milliseconds since the epoch.
    pub tick_ms: i64,
    /// Ticks after the last one fired and before this one that fire no run
    /// (the host was down, or `catch_up = "none"`).
    pub missed: u64,
}

/// Most missed ticks counted one by one; past it, `missed` says at least.
const MAX_COUNTED: u64 = 10_000;

impl Schedule {
    /// Compiles `[[workflows.<workflow>.schedules]]`.
    ///
    /// # Errors
    /// A [`DefinitionError`] naming the workflow and the schedule.
    pub fn compile(workflow: &str, c: &ScheduleConfig) -> Result<Schedule, DefinitionError> {
        let name = c.name.clone().unwrap_or_else(|| "schedule".to_owned());
        let err = |message: String| DefinitionError::Workflow {
            workflow: workflow.to_owned(),
            message: format!("schedule `{name}`: {message}"),
        };
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(err(
                "a schedule name must be non-empty and use only letters, digits, `_` and `-`"
                    .into(),
            ));
        }
        let fields = c.cron.split_whitespace().count();
        let nickname = c.cron.trim_start().starts_with('@');
        if !nickname && !(5..=6).contains(&fields) {
            return Err(err(format!(
                "`cron = \"{}\"` has {fields} fields; write 5 (minute hour day-of-month month day-of-week), 6 (seconds first), or one of {}",
                c.cron,
                NICKNAMES.join(", ")
            )));
        }
        let cron = parse_cron(&c.cron).map_err(|e| {
            let field = (!nickname).then(|| bad_field(&c.cron)).flatten();
            err(match field {
                Some((value, (what, range))) => format!(
                    "`cron = \"{}\"`: its {what} field is `{value}`, and {what} is {range} ({e})",
                    c.cron
                ),
                None if nickname => format!(
                    "`cron = \"{}\"` is not a cron pattern: {e}; the named ones are {}",
                    c.cron,
                    NICKNAMES.join(", ")
                ),
                None => format!("`cron = \"{}\"` is not a cron pattern: {e}", c.cron),
            })
        })?;
        let zone = c.timezone.as_deref().unwrap_or("UTC");
        let timezone: Tz = zone.parse().map_err(|_| {
            err(format!(
                "`timezone = \"{zone}\"` is not an IANA time zone (such as `Europe/Paris` or `UTC`)"
            ))
        })?;
        let input = c
            .input
            .as_deref()
            .map(Expr::compile)
            .transpose()
            .map_err(|e| err(format!("`input`: {e}")))?;
        let overlap = match c.overlap.as_deref().unwrap_or("skip") {
            "skip" => Overlap::Skip,
            "queue" => Overlap::Queue,
            "allow" => Overlap::Allow,
            other => {
                return Err(err(format!(
                    "`overlap = \"{other}\"`: use `skip`, `queue` or `allow`"
                )));
            }
        };
        let catch_up = match c.catch_up.as_deref().unwrap_or("one") {
            "one" => CatchUp::One,
            "none" => CatchUp::None,
            other => {
                return Err(err(format!(
                    "`catch_up = \"{other}\"`: use `one` or `none`"
                )));
            }
        };
        // A pattern that never matches (`0 0 30 2 *`) would never fire:
        // refused here rather than silent forever.
        if cron
            .find_next_occurrence(&Utc::now().with_timezone(&timezone), false)
            .is_err()
        {
            return Err(err(format!("`cron = \"{}\"` never fires", c.cron)));
        }
        Ok(Schedule {
            workflow: workflow.to_owned(),
            name,
            pattern: c.cron.clone(),
            timezone,
            cron,
            input,
            overlap,
            catch_up,
        })
    }

    /// The first tick strictly after `after_ms`.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let at = self.at(after_ms)?;
        self.cron
            .find_next_occurrence(&at, false)
            .ok()
            .map(|t| t.timestamp_millis())
    }

    /// The tick to fire at `now_ms`, if any: the latest tick at or before
    /// now, when it is after `last_ms` (the last tick fired, or from when
    /// the schedule counts). Earlier ticks since `last_ms` are `missed`.
    pub fn due(&self, last_ms: i64, now_ms: i64) -> Option<Due> {
        let now = self.at(now_ms)?;
        let latest = self
            .cron
            .find_previous_occurrence(&now, true)
            .ok()?
            .timestamp_millis();
        if latest <= last_ms {
            return None;
        }
        let mut missed = 0;
        let mut at = last_ms;
        while missed < MAX_COUNTED {
            match self.next_after(at) {
                Some(t) if t < latest => {
                    missed += 1;
                    at = t;
                }
                _ => break,
            }
        }
        Some(Due {
            tick_ms: latest,
            missed,
        })
    }

    /// `{scheduled_at, schedule}`: what the `input` mapping sees, and the
    /// run's input without one.
    pub fn tick_data(&self, tick_ms: i64) -> Value {
        json!({"scheduled_at": rfc3339(tick_ms), "schedule": self.name})
    }

    /// `ms` in the schedule's time zone, to the whole second (ticks are on
    /// whole seconds; croner would keep the fraction).
    fn at(&self, ms: i64) -> Option<DateTime<Tz>> {
        Utc.timestamp_millis_opt(ms.div_euclid(1000) * 1000)
            .single()
            .map(|t| t.with_timezone(&self.timezone))
    }
}

/// `ms` since the epoch as RFC 3339 UTC, to the millisecond.
pub fn rfc3339(ms: i64) -> String {
    Utc.timestamp_millis_opt(ms)
        .single()
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

/// Compiles every schedule of every workflow of `config`.
///
/// # Errors
/// The first [`DefinitionError`], or two schedules of one workflow with the
/// same name.
pub fn load_all(config: &crate::config::Config) -> Result<Vec<Schedule>, DefinitionError> {
    let mut all = Vec::new();
    for (workflow, w) in &config.workflows {
        let first = all.len();
        for c in &w.schedules {
            let s = Schedule::compile(workflow, c)?;
            if all[first..].iter().any(|o: &Schedule| o.name == s.name) {
                return Err(DefinitionError::Workflow {
                    workflow: workflow.clone(),
                    message: format!(
                        "two schedules are named `{}`; give each its own `name`",
                        s.name
                    ),
                });
            }
            all.push(s);
        }
    }
    Ok(all)
}

/// The named patterns a `cron` may be instead of fields (croner's).
const NICKNAMES: [&str; 6] = [
    "@yearly",
    "@annually",
    "@monthly",
    "@weekly",
    "@daily",
    "@hourly",
];

/// The fields of a five-field pattern, and what each may be; a six-field
/// one has the seconds first.
const FIELDS: [(&str, &str); 5] = [
    ("minute", "0–59"),
    ("hour", "0–23"),
    ("day-of-month", "1–31 (or L, W)"),
    ("month", "1–12 or JAN–DEC"),
    ("day-of-week", "0–7 or SUN–SAT (0 and 7 are Sunday)"),
];
const SECONDS: (&str, &str) = ("second", "0–59");

fn parse_cron(pattern: &str) -> Result<Cron, croner::errors::CronError> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(pattern)
}

/// The first field of `pattern` (5 or 6 fields) that does not parse on its
/// own (every other field `*`): its text, name and range.
fn bad_field(pattern: &str) -> Option<(String, (&'static str, &'static str))> {
    let fields: Vec<&str> = pattern.split_whitespace().collect();
    let names: Vec<(&str, &str)> = match fields.len() {
        5 => FIELDS.to_vec(),
        6 => std::iter::once(SECONDS).chain(FIELDS).collect(),
        _ => return None,
    };
    (0..fields.len()).find_map(|i| {
        let alone: Vec<&str> = (0..fields.len())
            .map(|j| if j == i { fields[j] } else { "*" })
            .collect();
        parse_cron(&alone.join(" "))
            .is_err()
            .then(|| (fields[i].to_owned(), names[i]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(cron: &str, tz: &str) -> Schedule {
        Schedule::compile(
            "w",
            &ScheduleConfig {
                cron: cron.into(),
                timezone: Some(tz.into()),
                ..ScheduleConfig::default()
            },
        )
        .unwrap()
    }

    fn ms(text: &str) -> i64 {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .timestamp_millis()
    }

    #[test]
    fn named_patterns_and_bad_fields_are_told() {
        let hourly = schedule("@hourly", "UTC");
        assert_eq!(
            hourly.next_after(ms("2026-01-01T00:00:30Z")),
            Some(ms("2026-01-01T01:00:00Z"))
        );
        let daily = schedule("@daily", "UTC");
        assert_eq!(
            daily.next_after(ms("2026-01-01T00:00:30Z")),
            Some(ms("2026-01-02T00:00:00Z"))
        );
        let refused = |cron: &str| {
            Schedule::compile(
                "w",
                &ScheduleConfig {
                    cron: cron.into(),
                    ..ScheduleConfig::default()
                },
            )
            .unwrap_err()
            .to_string()
        };
        let e = refused("0 61 * * *");
        assert!(
            e.contains("its hour field is `61`, and hour is 0–23"),
            "{e}"
        );
        let e = refused("0 0 * 13 *");
        assert!(e.contains("its month field is `13`"), "{e}");
        let e = refused("61 0 0 * * *");
        assert!(e.contains("its second field is `61`"), "{e}");
        let e = refused("@often");
        assert!(e.contains("the named ones are @yearly"), "{e}");
    }

    #[test]
    fn five_and_six_fields() {
        let every_minute = schedule("* * * * *", "UTC");
        assert_eq!(
            every_minute.next_after(ms("2026-01-01T00:00:30Z")),
            Some(ms("2026-01-01T00:01:00Z"))
        );
        let every_second = schedule("*/1 * * * * *", "UTC");
        assert_eq!(
            every_second.next_after(ms("2026-01-01T00:00:30Z")),
            Some(ms("2026-01-01T00:00:31Z"))
        );
        let e = Schedule::compile(
            "w",
            &ScheduleConfig {
                cron: "* * * *".into(),
                ..ScheduleConfig::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("has 4 fields"), "{e}");
        let e = Schedule::compile(
            "w",
            &ScheduleConfig {
                cron: "* * * * *".into(),
                timezone: Some("Mars/Olympus".into()),
                ..ScheduleConfig::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("not an IANA time zone"), "{e}");
    }

    #[test]
    fn a_pattern_is_read_in_its_time_zone() {
        let nightly = schedule("0 2 * * *", "Europe/Paris");
        // 02:00 in Paris in winter is 01:00 UTC.
        assert_eq!(
            nightly.next_after(ms("2026-01-10T12:00:00Z")),
            Some(ms("2026-01-11T01:00:00Z"))
        );
    }

    #[test]
    fn the_latest_missed_tick_is_due_and_the_others_are_counted() {
        let every_second = schedule("* * * * * *", "UTC");
        let last = ms("2026-01-01T00:00:10Z");
        let due = every_second
            .due(last, ms("2026-01-01T00:00:15.400Z"))
            .unwrap();
        assert_eq!(due.tick_ms, ms("2026-01-01T00:00:15Z"));
        assert_eq!(due.missed, 4, "ticks 11 to 14 fire no run");
        assert_eq!(
            every_second.due(due.tick_ms, ms("2026-01-01T00:00:15.900Z")),
            None
        );
    }

    #[test]
    fn daylight_saving_gaps_and_repeats() {
        // Paris, 2026-03-29: 02:00 → 03:00. A fixed 02:30 fires once, just
        // after the gap.
        let fixed = schedule("30 2 * * *", "Europe/Paris");
        let at = fixed.next_after(ms("2026-03-28T12:00:00Z")).unwrap();
        assert_eq!(
            at,
            ms("2026-03-29T01:00:00Z"),
            "03:00 CEST: {}",
            rfc3339(at)
        );
        let next = fixed.next_after(at).unwrap();
        assert_eq!(next, ms("2026-03-30T00:30:00Z"));
        // 2026-10-25: 03:00 → 02:00. A fixed 02:30 fires once, the first time.
        let at = fixed.next_after(ms("2026-10-24T12:00:00Z")).unwrap();
        assert_eq!(
            at,
            ms("2026-10-25T00:30:00Z"),
            "02:30 CEST: {}",
            rfc3339(at)
        );
        assert_eq!(fixed.next_after(at).unwrap(), ms("2026-10-26T01:30:00Z"));
    }
}
