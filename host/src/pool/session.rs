//! One MCP client session and the task that owns it.
//!
//! The owner task holds the rmcp `RunningService`; nothing else does, because
//! dropping it ends the session. Callers reach the session only by submitting an
//! [`Operation`]: a closure over the client `Peer` plus metadata for spans and
//! status. Operations run concurrently (MCP multiplexes by request id); the owner
//! tracks each one so that when the transport dies it can fail all of them at
//! once with the reason. It also keeps the catalog fresh (`list_changed`,
//! `subscriptions/listen`, periodic re-lists) and pings an idle transport.
//!
//! The transport itself (a child process, an HTTP client) and the handshake are
//! [`super::transport`]'s; a session starts from what it hands over
//! ([`Connected`]).

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rmcp::model::{
    ClientCapabilities, ClientConfig, ClientRequest, Implementation, PingRequest,
    ProgressNotificationParam, ProtocolVersion, ServerNotification, SubscriptionFilter,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpError;
use rmcp::{ClientHandler, Peer, RoleClient, ServiceError};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::catalog::{self, Advertised, Catalog, Dirty};
use super::{ConnCounters, PoolError, ProgressRoutes, Settings};
use crate::capability::Progress;

/// What an operation does: a closure over the session's client peer. It is `Fn`
/// so the pool can replay it once on a fresh session after an HTTP 404.
pub type OpFn =
    Arc<dyn Fn(Peer<RoleClient>) -> BoxFuture<'static, Result<Value, ServiceError>> + Send + Sync>;

/// Diagnostics only: spans, logs and status. Never used to decide what runs.
#[derive(Debug, Clone)]
pub struct OpMeta {
    pub operation: &'static str,
    pub connection: Arc<str>,
    pub seq: u64,
    pub submitted_at: Instant,
}

pub(crate) struct Operation {
    pub meta: OpMeta,
    pub run: OpFn,
    pub timeout: Duration,
    /// Ticks on each progress report of the call; a report restarts the
    /// timeout.
    pub progress: Option<watch::Receiver<u64>>,
    pub reply: oneshot::Sender<Result<Value, PoolError>>,
}

/// The pool's handle on a live session. Dropping the last clone stops the owner
/// task, which closes the session and reaps a child process.
#[derive(Clone)]
pub(crate) struct Session {
    inner: Arc<SessionInner>,
}

struct SessionInner {
    ops: mpsc::UnboundedSender<Operation>,
    /// `Some(reason)` once the session is dead.
    death: watch::Receiver<Option<String>>,
    catalog: watch::Receiver<Arc<Catalog>>,
    /// Stops the owner now (shutdown, eviction).
    stop: CancellationToken,
    /// Stops accepting operations; the owner closes once in-flight ones finish.
    drain: CancellationToken,
    owner: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    pub pid: Option<u32>,
    /// HTTP: the event streams open now (`None` for stdio, where the server
    /// can always notify).
    streams: Option<Arc<AtomicUsize>>,
}

impl Drop for SessionInner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Session {
    pub(crate) fn is_alive(&self) -> bool {
        self.inner.death.borrow().is_none() && !self.inner.ops.is_closed()
    }

    pub(crate) fn same(&self, other: &Session) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.inner.pid
    }

    pub(crate) fn catalog(&self) -> watch::Receiver<Arc<Catalog>> {
        self.inner.catalog.clone()
    }

    pub(crate) fn current_catalog(&self) -> Arc<Catalog> {
        self.inner.catalog.borrow().clone()
    }

    /// `live` while the server can push notifications to us, else `polling`.
    pub(crate) fn notifications(&self) -> &'static str {
        match &self.inner.streams {
            Some(open) if open.load(Ordering::Relaxed) == 0 => "polling",
            _ => "live",
        }
    }

    /// Queues `op`. Fails with the death reason if the session is gone.
    pub(crate) fn submit(&self, op: Operation) -> Result<(), String> {
        if let Some(reason) = self.inner.death.borrow().clone() {
            return Err(reason);
        }
        self.inner
            .ops
            .send(op)
            .map_err(|_| "session closed".to_owned())
    }

    /// Lets in-flight operations finish, then closes (settings changed).
    pub(crate) fn drain(&self) {
        self.inner.drain.cancel();
    }

    /// Stops the owner and waits for it, so the child is reaped when this returns.
    pub(crate) async fn close(&self) {
        self.inner.stop.cancel();
        let owner = self
            .inner
            .owner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(owner) = owner {
            let _ = owner.await;
        }
    }
}

/// The rmcp client handler: names us, and turns `list_changed` into a dirty
/// mark for the refresher. It never awaits a request: the response could only be
/// routed by the receive loop it would be blocking.
pub(super) struct PoolClient {
    pub(super) dirty: Arc<Dirty>,
    pub(super) progress: Arc<ProgressRoutes>,
    pub(super) connection: Arc<str>,
}

impl ClientHandler for PoolClient {
    fn get_info(&self) -> ClientConfig {
        // Tasks: a server may answer a long tool call with a task, which
        // the call then follows (`tasks/get`) instead of holding a request.
        ClientConfig::new(
            // Elicitation: a question a server asks during a call goes to
            // the run that made it (a person answers it there), or is
            // declined.
            ClientCapabilities::builder()
                .enable_tasks()
                .enable_elicitation()
                .build(),
            Implementation::new("wf-host", env!("CARGO_PKG_VERSION")),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        // Handled on a task of its own (rmcp spawns one per request), so
        // waiting for a person blocks no receive loop.
        match self.progress.sole_asker() {
            Ok(asker) => Ok(asker.ask(request).await),
            Err(calls) => {
                tracing::warn!(connection = %self.connection, calls,
                    "the server asked a question that cannot be told apart from its calls in flight; declined");
                Ok(rmcp::model::ElicitResult::new(
                    rmcp::model::ElicitationAction::Decline,
                ))
            }
        }
    }

    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.dirty.mark(catalog::TOOLS);
    }

    async fn on_resource_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.dirty.mark(catalog::RESOURCES);
    }

    async fn on_prompt_list_changed(&self, _: NotificationContext<RoleClient>) {
        self.dirty.mark(catalog::PROMPTS);
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _: NotificationContext<RoleClient>,
    ) {
        let message = params
            .message
            .map(|m| crate::capability::truncate_utf8(m, MAX_PROGRESS_MESSAGE));
        self.progress.deliver(
            &params.progress_token,
            Progress {
                progress: params.progress,
                total: params.total,
                message,
            },
        );
    }
}

/// The longest progress message kept, in bytes.
const MAX_PROGRESS_MESSAGE: usize = 1024;

/// Whether the session negotiated a revision without `initialize`, whose
/// change notifications arrive only on a `subscriptions/listen` stream.
fn needs_listen(peer: &Peer<RoleClient>) -> bool {
    peer.peer_info()
        .is_some_and(|info| !info.protocol_version.has_initialize())
}

/// How long to wait before opening `subscriptions/listen` again after it ended.
const RELISTEN_DELAY: Duration = Duration::from_secs(1);

/// Keeps a `subscriptions/listen` stream open for the session's life and turns
/// its change notifications into dirty marks. Each time the server acknowledges
/// a stream everything is marked stale, since a change may have come before:
/// the first stream races the listing on connect, and a stream that ended (the
/// server closed it, or it broke) is reopened. A server that refuses the
/// request has no subscriptions: the catalog is then only listed on connect.
async fn listen_for_changes(
    connection: Arc<str>,
    peer: Peer<RoleClient>,
    dirty: Arc<Dirty>,
    streams: Arc<AtomicUsize>,
) {
    /// Counts an acknowledged stream as open until it ends.
    struct Open(Arc<AtomicUsize>);
    impl Drop for Open {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }

    let filter = SubscriptionFilter::builder()
        .tools_list_changed()
        .resources_list_changed()
        .prompts_list_changed()
        .build();
    loop {
        let mut subscription = match peer.listen(filter.clone()).await {
            Ok(subscription) => subscription,
            Err(ServiceError::McpError(e)) => {
                tracing::warn!(connection = %connection, "the server refused subscriptions/listen; list changes will not be seen: {}", e.message);
                return;
            }
            Err(e) => {
                tracing::debug!(connection = %connection, "subscriptions/listen failed: {e}");
                if peer.is_transport_closed() {
                    return;
                }
                tokio::time::sleep(RELISTEN_DELAY).await;
                continue;
            }
        };
        streams.fetch_add(1, Ordering::Relaxed);
        let open = Open(streams.clone());
        dirty.mark(catalog::ALL);
        tracing::debug!(connection = %connection, "listening for list changes");
        loop {
            match subscription.next().await {
                Ok(Some(ServerNotification::ToolListChangedNotification(_))) => {
                    dirty.mark(catalog::TOOLS)
                }
                Ok(Some(ServerNotification::ResourceListChangedNotification(_))) => {
                    dirty.mark(catalog::RESOURCES)
                }
                Ok(Some(ServerNotification::PromptListChangedNotification(_))) => {
                    dirty.mark(catalog::PROMPTS)
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(connection = %connection, "subscriptions/listen stream failed: {e}");
                    break;
                }
            }
        }
        drop(open);
        tracing::debug!(connection = %connection, end = ?subscription.end(), "subscriptions/listen ended");
        if peer.is_transport_closed() {
            return;
        }
        tokio::time::sleep(RELISTEN_DELAY).await;
    }
}

/// The death reason when the HTTP server no longer knows the session. Only the
/// request that got the 404 itself is known to be unprocessed; the session's
/// other in-flight requests may have run, so they fail instead of replaying.
pub(crate) const EXPIRED: &str = "the server forgot the session (HTTP 404)";

/// How long a stubborn child may take to exit after we close its stdin.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(8);
/// How long a health ping may take before the session is declared dead.
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// A transport that is up and past the lifecycle handshake: what [`start`]
/// turns into a session.
pub(super) struct Connected {
    pub running: RunningService<RoleClient, PoolClient>,
    /// The child's process id (stdio).
    pub pid: Option<u32>,
    /// HTTP: the event streams open now.
    pub streams: Option<Arc<AtomicUsize>>,
    /// Where the handler marks what a `list_changed` made stale.
    pub dirty: Arc<Dirty>,
    /// Helper tasks that live exactly as long as the session (stderr drain).
    pub aux: JoinSet<()>,
}

/// Starts a session on a connected transport: lists the catalog and spawns
/// the owner task.
pub(super) async fn start(
    settings: &Settings,
    counters: Arc<ConnCounters>,
    pinned: Option<Arc<BTreeMap<String, String>>>,
    connected: Connected,
) -> Result<Session, String> {
    let Connected {
        running,
        pid,
        streams,
        dirty,
        mut aux,
    } = connected;
    counters.sessions_opened.fetch_add(1, Ordering::Relaxed);
    crate::metrics::metrics().session_opened(&settings.id);

    let peer = running.peer().clone();
    // rmcp's response cache would answer list calls from stale data after the
    // server died, hiding the failure.
    peer.set_response_cache_config(rmcp::ClientCacheConfig::disabled())
        .await;
    let streams = if needs_listen(&peer) {
        // At 2026-07-28 the listen stream is what carries change notifications,
        // over stdio too: the session is `live` while one is open.
        let streams = streams.unwrap_or_default();
        aux.spawn(listen_for_changes(
            settings.id.clone(),
            peer.clone(),
            dirty.clone(),
            streams.clone(),
        ));
        Some(streams)
    } else {
        streams
    };
    let advertised = peer
        .peer_info()
        .map(|info| Advertised {
            tools: info.capabilities.tools.is_some(),
            resources: info.capabilities.resources.is_some(),
            prompts: info.capabilities.prompts.is_some(),
        })
        .unwrap_or(Advertised {
            tools: true,
            resources: false,
            prompts: false,
        });
    let (catalog_tx, catalog_rx) = watch::channel(Arc::new(Catalog::default()));
    catalog::refresh(
        &peer,
        &settings.id,
        catalog::ALL,
        advertised,
        settings.catalog_cap,
        &catalog_tx,
    )
    .await
    .map_err(|e| format!("listing the catalog failed: {e}"))?;
    counters.set_catalog(&catalog_rx.borrow());
    if let Some(pinned) = &pinned {
        warn_drift(&catalog_rx.borrow(), pinned);
    }

    let (ops_tx, ops_rx) = mpsc::unbounded_channel();
    let (death_tx, death_rx) = watch::channel(None);
    let stop = CancellationToken::new();
    let drain = CancellationToken::new();
    let owner = Owner {
        settings: settings.clone(),
        counters,
        pinned,
        peer,
        advertised,
        dirty,
        catalog: catalog_tx,
        death: death_tx,
        stop: stop.clone(),
        drain: drain.clone(),
        aux,
    };
    let span = tracing::info_span!("session", connection = %settings.id);
    let counters = owner.counters.clone();
    let handle = tokio::spawn(
        async move {
            // A panic here is a defect; counted and logged, it ends this
            // session only (its callers see the session closed).
            if AssertUnwindSafe(owner.run(running, ops_rx))
                .catch_unwind()
                .await
                .is_err()
            {
                counters.session_panics.fetch_add(1, Ordering::Relaxed);
                tracing::error!("the session's owner panicked");
            }
        }
        .instrument(span),
    );
    Ok(Session {
        inner: Arc::new(SessionInner {
            ops: ops_tx,
            death: death_rx,
            catalog: catalog_rx,
            stop,
            drain,
            owner: std::sync::Mutex::new(Some(handle)),
            pid,
            streams,
        }),
    })
}

struct Owner {
    settings: Settings,
    counters: Arc<ConnCounters>,
    pinned: Option<Arc<BTreeMap<String, String>>>,
    peer: Peer<RoleClient>,
    advertised: Advertised,
    dirty: Arc<Dirty>,
    catalog: watch::Sender<Arc<Catalog>>,
    death: watch::Sender<Option<String>>,
    stop: CancellationToken,
    drain: CancellationToken,
    /// Helper tasks that live exactly as long as the session (stderr drain).
    aux: JoinSet<()>,
}

/// How an in-flight operation ended, as seen by the owner.
enum Ended {
    Done,
    /// The transport failed under it: check whether the session is still alive.
    TransportError,
    /// The HTTP server forgot the session.
    Expired,
}

/// An owner's operations in flight, each ending in what it means for the
/// session.
type Inflight = FuturesUnordered<BoxFuture<'static, Ended>>;

impl Owner {
    async fn run(
        mut self,
        running: RunningService<RoleClient, PoolClient>,
        mut ops: mpsc::UnboundedReceiver<Operation>,
    ) {
        let mut quit = Some(running.cancellation_token());
        let mut done = Box::pin(running.waiting());
        // The operations in flight, polled by this task itself: a reply from
        // the server wakes this task, which answers the caller, with no task
        // of its own per operation to schedule in between.
        let mut inflight = Inflight::new();
        let mut refresher = self.spawn_refresher(0);
        // At most one health check at a time, polled beside dispatch: a slow
        // ping must not hold up the operations queued behind it.
        let mut health: Option<HealthCheck> = None;
        let mut ping = self.settings.ping_interval.map(|every| {
            let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            interval
        });
        // Re-lists even without `list_changed`: a server may announce changes
        // where this session cannot hear them (a dead event stream, a newer
        // protocol's subscriptions).
        let every = self.settings.catalog_refresh;
        let mut relist = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        relist.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_activity = tokio::time::Instant::now();
        let mut accepting = true;
        let mut draining = false;
        // Set once `done` has resolved: a finished future must not be polled
        // again when the session closes.
        let mut service_ended = false;

        let reason: String = loop {
            let idle_deadline = self
                .settings
                .idle_timeout
                .filter(|_| inflight.is_empty())
                .map(|idle| last_activity + idle);
            tokio::select! {
                quit_reason = &mut done => {
                    service_ended = true;
                    break match quit_reason {
                        Ok(rmcp::service::QuitReason::Closed) => "the server closed the session (process exited or stream ended)".to_owned(),
                        Ok(other) => format!("session ended: {other:?}"),
                        Err(e) => format!("session task failed: {e}"),
                    };
                }
                _ = self.stop.cancelled() => break "the session was closed by the host".to_owned(),
                _ = self.drain.cancelled(), if !draining => {
                    // No new operations; those already queued still run
                    // (`recv` gives them, then `None`).
                    draining = true;
                    ops.close();
                }
                op = ops.recv(), if accepting => match op {
                    Some(op) => {
                        last_activity = tokio::time::Instant::now();
                        self.start(op, &mut inflight);
                    }
                    None => accepting = false,
                },
                Some(ended) = inflight.next() => {
                    last_activity = tokio::time::Instant::now();
                    match ended {
                        Ended::Done => {}
                        Ended::Expired => break EXPIRED.to_owned(),
                        Ended::TransportError => self.check_health(&mut health),
                    }
                }
                _ = relist.tick() => self.dirty.mark(catalog::ALL),
                _ = async { ping.as_mut().expect("guarded").tick().await }, if ping.is_some() => {
                    self.check_health(&mut health);
                }
                verdict = async { health.as_mut().expect("guarded").await }, if health.is_some() => {
                    health = None;
                    if let Some(reason) = verdict {
                        break reason;
                    }
                }
                _ = async { tokio::time::sleep_until(idle_deadline.expect("guarded")).await }, if idle_deadline.is_some() => {
                    break "idle timeout".to_owned();
                }
                ended = &mut refresher => {
                    // The refresher only ends when listing failed: find out why,
                    // and retry after a backoff that grows while it keeps failing.
                    let failures = ended.unwrap_or(1);
                    self.check_health(&mut health);
                    refresher = self.spawn_refresher(failures);
                }
                else => {
                    if !accepting && inflight.is_empty() {
                        break "drained after a settings change".to_owned();
                    }
                }
            }
            if !accepting && inflight.is_empty() {
                break "drained after a settings change".to_owned();
            }
        };

        // Fail everything still pending, at once, with the reason.
        tracing::info!(reason = %reason, "session closing");
        // Each in-flight operation watches `death` and fails at once.
        let _ = self.death.send(Some(reason.clone()));
        refresher.abort();
        self.counters.set_last_error(&reason);
        ops.close();
        while let Ok(op) = ops.try_recv() {
            let _ = op.reply.send(Err(self.closed_error(&reason)));
        }
        // The operations reply themselves on `died`; wait for them briefly.
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            while inflight.next().await.is_some() {}
        })
        .await;
        drop(inflight);

        // Close the service and wait for it, so a child process is reaped.
        if let Some(quit) = quit.take() {
            quit.cancel();
        }
        if !service_ended
            && tokio::time::timeout(CLOSE_TIMEOUT, &mut done)
                .await
                .is_err()
        {
            tracing::warn!("session did not close in time; dropping it");
        }
        drop(done);
        self.aux.shutdown().await;
    }

    fn closed_error(&self, reason: &str) -> PoolError {
        PoolError::SessionClosed {
            connection: self.settings.id.to_string(),
            reason: reason.to_owned(),
        }
    }

    fn start(&self, op: Operation, inflight: &mut Inflight) {
        let Operation {
            meta,
            run,
            timeout,
            progress,
            mut reply,
        } = op;
        let span = tracing::info_span!(
            "op",
            operation = meta.operation,
            connection = %meta.connection,
            seq = meta.seq,
            queued_us = meta.submitted_at.elapsed().as_micros() as u64,
        );
        let peer = self.peer.clone();
        let counters = self.counters.clone();
        let connection = self.settings.id.to_string();
        let mut death = self.death.subscribe();
        let ceiling = self.settings.max_call_time;
        let op = async move {
            counters.calls.fetch_add(1, Ordering::Relaxed);
            // Counted down however the request ends (answered, timed out,
            // its caller gone, the session dead).
            struct InFlight<'a>(&'a AtomicU64);
            impl Drop for InFlight<'_> {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::Relaxed);
                }
            }
            counters.in_flight.fetch_add(1, Ordering::Relaxed);
            let _in_flight = InFlight(&counters.in_flight);
            let call = with_progress(timeout, ceiling, run(peer), progress);
            // Dropping `call` (caller gone, session died) drops the rmcp
            // request future, which sends `notifications/cancelled`.
            let (result, ended) = tokio::select! {
                r = call => match r {
                    Waited::Answered(Ok(value)) => (Ok(value), Ended::Done),
                    Waited::Answered(Err(e)) => classify(&connection, e),
                    Waited::Silent => (Err(PoolError::Timeout { connection, operation: meta.operation, after: timeout }), Ended::Done),
                    Waited::TooLong => (Err(PoolError::TooLong { connection, operation: meta.operation, after: ceiling }), Ended::Done),
                },
                _ = reply.closed() => {
                    tracing::debug!("caller went away; request cancelled");
                    return Ended::Done;
                }
                reason = death.wait_for(Option::is_some) => {
                    // Even when the session died of a 404, this request may
                    // have been processed: only the one that got the 404
                    // itself (`classify`) is known not to be, and may be
                    // replayed. This one fails.
                    let reason = reason.ok().and_then(|r| r.clone()).unwrap_or_else(|| "session closed".into());
                    (Err(PoolError::SessionClosed { connection, reason }), Ended::Done)
                }
            };
            if let Err(e) = &result {
                counters.failures.fetch_add(1, Ordering::Relaxed);
                counters.set_last_error(&e.to_string());
                tracing::debug!(error = %e, "operation failed");
            }
            let _ = reply.send(result);
            ended
        }
        .instrument(span);
        // A panicking operation drops its reply (its caller gets an error),
        // not the session.
        inflight.push(Box::pin(AssertUnwindSafe(op).catch_unwind().map(|ended| {
            ended.unwrap_or_else(|_| {
                tracing::error!("an operation panicked");
                Ended::Done
            })
        })));
    }

    /// Starts a health check unless one is already running.
    fn check_health(&self, health: &mut Option<HealthCheck>) {
        if health.is_none() {
            *health = Some(Box::pin(health_check(self.peer.clone())));
        }
    }

    /// One refresher per session: waits for dirty marks and relists, so a burst
    /// of `list_changed` costs one refresh, on this same session. It ends when a
    /// refresh fails, with the number of failures in a row; a refresher started
    /// after `failures` waits a backoff before each retry.
    fn spawn_refresher(&self, mut failures: u32) -> tokio::task::JoinHandle<u32> {
        let peer = self.peer.clone();
        let dirty = self.dirty.clone();
        let catalog = self.catalog.clone();
        let counters = self.counters.clone();
        let advertised = self.advertised;
        let id = self.settings.id.clone();
        let cap = self.settings.catalog_cap;
        let pinned = self.pinned.clone();
        tokio::spawn(
            async move {
                loop {
                    let kinds = dirty.take().await;
                    if failures > 0 {
                        tokio::time::sleep(super::backoff(failures)).await;
                    }
                    if let Err(e) =
                        catalog::refresh(&peer, &id, kinds, advertised, cap, &catalog).await
                    {
                        tracing::warn!(failures = failures + 1, "catalog refresh failed: {e}");
                        // Keep the kinds dirty for the next attempt.
                        dirty.mark(kinds);
                        return failures + 1;
                    }
                    failures = 0;
                    counters.set_catalog(&catalog.borrow());
                    if let Some(pinned) = &pinned {
                        warn_drift(&catalog.borrow(), pinned);
                    }
                    tracing::debug!(kinds, "catalog refreshed");
                }
            }
            .in_current_span(),
        )
    }
}

/// Logs the tools that no longer match the lock; calls to them are refused.
fn warn_drift(catalog: &Catalog, pinned: &BTreeMap<String, String>) {
    let drifted = super::drift(catalog, pinned);
    if !drifted.is_empty() {
        let tools: Vec<String> = drifted
            .iter()
            .map(|d| format!("{} ({})", d.tool, d.reason))
            .collect();
        tracing::warn!(
            tools = %tools.join(", "),
            "tools differ from {}; calls to them are refused until reviewed and re-pinned with `wf-host pin`",
            super::pin::LOCK_FILE
        );
    }
}

/// How a call run by [`with_progress`] ended.
enum Waited<T> {
    Answered(T),
    /// `timeout` passed without an answer or a progress report.
    Silent,
    /// Its progress reports kept it going until `ceiling`.
    TooLong,
}

/// Runs `call` until it answers, or `timeout` passes without an answer or a
/// progress report, or `ceiling` passes however often it reports. Each
/// report restarts the timeout. A call the pool keeps alive itself (a task
/// it follows, a question waiting for a person: [`super::KEEP_ALIVE_TICK`])
/// has no ceiling here.
async fn with_progress<T>(
    timeout: Duration,
    ceiling: Duration,
    call: impl Future<Output = T>,
    progress: Option<watch::Receiver<u64>>,
) -> Waited<T> {
    let Some(mut reports) = progress else {
        return match tokio::time::timeout(timeout, call).await {
            Ok(answer) => Waited::Answered(answer),
            Err(_) => Waited::Silent,
        };
    };
    tokio::pin!(call);
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let last = tokio::time::sleep(ceiling.max(timeout));
    tokio::pin!(last);
    let (mut listening, mut capped) = (true, true);
    loop {
        tokio::select! {
            answer = &mut call => return Waited::Answered(answer),
            () = &mut deadline => return Waited::Silent,
            () = &mut last, if capped => return Waited::TooLong,
            changed = reports.changed(), if listening => {
                if changed.is_err() {
                    listening = false;
                    continue;
                }
                if *reports.borrow_and_update() >= super::KEEP_ALIVE_TICK {
                    capped = false;
                }
                deadline.as_mut().reset(tokio::time::Instant::now() + timeout);
            }
        }
    }
}

/// A health check in flight: `Some(reason)` when the session is dead.
type HealthCheck = std::pin::Pin<Box<dyn Future<Output = Option<String>> + Send>>;

/// Pings with a deadline. `Some(reason)` means the session is dead.
async fn health_check(peer: Peer<RoleClient>) -> Option<String> {
    if peer.is_transport_closed() {
        return Some("the transport closed".to_owned());
    }
    let ping = peer.send_request(ClientRequest::PingRequest(PingRequest::default()));
    match tokio::time::timeout(PING_TIMEOUT, ping).await {
        Ok(Ok(_)) => None,
        // An error answer is an answer: the server is alive. Servers of
        // 2026-07-28 answer `ping` with -32601 (the Python SDK and rmcp do).
        Ok(Err(ServiceError::McpError(_))) => None,
        Ok(Err(e)) if is_session_expired(&e) => Some(EXPIRED.to_owned()),
        Ok(Err(e)) => Some(format!("ping failed: {e}")),
        Err(_) => Some(format!(
            "ping got no answer within {}s",
            PING_TIMEOUT.as_secs()
        )),
    }
}

fn classify(connection: &str, e: ServiceError) -> (Result<Value, PoolError>, Ended) {
    let connection = connection.to_owned();
    match e {
        ServiceError::McpError(data) => (
            Err(PoolError::Server {
                connection,
                code: data.code.0,
                message: data.message.to_string(),
            }),
            Ended::Done,
        ),
        ServiceError::Timeout { timeout } => (
            Err(PoolError::Timeout {
                connection,
                operation: "request",
                after: timeout,
            }),
            Ended::Done,
        ),
        e if is_session_expired(&e) => (Err(PoolError::Expired { connection }), Ended::Expired),
        e => (
            Err(PoolError::SessionClosed {
                connection,
                reason: transport_reason(&e),
            }),
            Ended::TransportError,
        ),
    }
}

/// What to tell an operator about a transport failure: the OAuth or TLS
/// problem under it when there is one (rmcp's own message names only its
/// types), else the error itself.
fn transport_reason(err: &ServiceError) -> String {
    if let ServiceError::TransportSend(e) = err {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e.error.as_ref());
        while let Some(s) = source {
            match s.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
                Some(StreamableHttpError::Auth(auth)) => return auth.to_string(),
                Some(StreamableHttpError::Client(client)) => {
                    if let Some(tls) = super::http::explain_tls(client) {
                        return tls;
                    }
                }
                _ => {}
            }
            source = s.source();
        }
    }
    err.to_string()
}

/// An HTTP 404 for our session id: the server restarted or dropped us.
fn is_session_expired(err: &ServiceError) -> bool {
    let ServiceError::TransportSend(e) = err else {
        return false;
    };
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e.error.as_ref());
    while let Some(s) = source {
        if matches!(
            s.downcast_ref::<StreamableHttpError<reqwest::Error>>(),
            Some(StreamableHttpError::SessionExpired)
        ) {
            return true;
        }
        source = s.source();
    }
    false
}

/// Sequence numbers for operation metadata, process-wide.
pub(crate) fn next_seq() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(1);
    SEQ.fetch_add(1, Ordering::Relaxed)
}
