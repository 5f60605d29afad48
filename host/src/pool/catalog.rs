//! The live catalog of one connection: its tools, resources and prompts, listed
//! after `initialize` and refreshed on `list_changed` on the same session.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use rmcp::model::{PaginatedRequestParams, Prompt, Resource, Tool};
use rmcp::{Peer, RoleClient, ServiceError};
use tokio::sync::{Notify, watch};

/// Pages followed per list: a server that keeps sending a fresh `nextCursor`
/// (empty pages, say) is cut off here instead of being followed for ever.
pub const MAX_CATALOG_PAGES: usize = 100;

/// What one connection offers, as last listed.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    pub tools: Vec<Tool>,
    pub resources: Vec<Resource>,
    pub prompts: Vec<Prompt>,
    /// Bumped on every refresh that changed something, so waiters can tell
    /// a new list from an old one.
    pub version: u64,
    /// The pinning digest of each tool (see [`super::pin::digest`]).
    digests: HashMap<String, String>,
}

impl Catalog {
    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The pinning digest of the tool `name`, as listed.
    pub fn digest(&self, name: &str) -> Option<&str> {
        self.digests.get(name).map(String::as_str)
    }

    fn same_lists(&self, other: &Catalog) -> bool {
        self.tools == other.tools
            && self.resources == other.resources
            && self.prompts == other.prompts
    }
}

/// Which lists a notification marked stale. Bits, so a burst of notifications
/// collapses into one refresh per kind.
#[derive(Debug, Default)]
pub(crate) struct Dirty {
    bits: AtomicU8,
    wake: Notify,
}

pub(crate) const TOOLS: u8 = 1;
pub(crate) const RESOURCES: u8 = 2;
pub(crate) const PROMPTS: u8 = 4;
pub(crate) const ALL: u8 = TOOLS | RESOURCES | PROMPTS;

impl Dirty {
    /// Marks `kinds` stale and wakes the refresher. Never blocks: this runs in
    /// the notification handler, which must not await a request.
    pub(crate) fn mark(&self, kinds: u8) {
        self.bits.fetch_or(kinds, Ordering::AcqRel);
        self.wake.notify_one();
    }

    /// Waits until something is stale and takes the stale set.
    pub(crate) async fn take(&self) -> u8 {
        loop {
            let bits = self.bits.swap(0, Ordering::AcqRel);
            if bits != 0 {
                return bits;
            }
            self.wake.notified().await;
        }
    }
}

/// Which kinds the server advertised in `initialize`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Advertised {
    pub tools: bool,
    pub resources: bool,
    pub prompts: bool,
}

/// Lists `kinds` (following pagination, capped at `cap` items per kind) and
/// publishes a new catalog version; kinds not listed keep their old entries.
pub(crate) async fn refresh(
    peer: &Peer<RoleClient>,
    connection: &str,
    kinds: u8,
    advertised: Advertised,
    cap: usize,
    cell: &watch::Sender<Arc<Catalog>>,
) -> Result<(), ServiceError> {
    let mut next = (**cell.borrow()).clone();
    if kinds & TOOLS != 0 && advertised.tools {
        next.tools = list_pages(connection, "tools", cap, |cursor| async move {
            let page = peer.list_tools(Some(page_params(cursor))).await?;
            Ok((page.tools, page.next_cursor))
        })
        .await?;
    }
    if kinds & RESOURCES != 0 && advertised.resources {
        next.resources = list_pages(connection, "resources", cap, |cursor| async move {
            let page = peer.list_resources(Some(page_params(cursor))).await?;
            Ok((page.resources, page.next_cursor))
        })
        .await?;
    }
    if kinds & PROMPTS != 0 && advertised.prompts {
        next.prompts = list_pages(connection, "prompts", cap, |cursor| async move {
            let page = peer.list_prompts(Some(page_params(cursor))).await?;
            Ok((page.prompts, page.next_cursor))
        })
        .await?;
    }
    if kinds & TOOLS != 0 {
        next.digests = next
            .tools
            .iter()
            .map(|t| (t.name.to_string(), super::pin::digest(t)))
            .collect();
    }
    // A periodic re-list that found nothing new publishes nothing.
    cell.send_if_modified(|current| {
        if current.version > 0 && current.same_lists(&next) {
            return false;
        }
        next.version = current.version + 1;
        *current = Arc::new(next);
        true
    });
    Ok(())
}

fn page_params(cursor: Option<String>) -> PaginatedRequestParams {
    PaginatedRequestParams::default().with_cursor(cursor)
}

/// Follows `nextCursor` to the end, stopping at `cap` items, at
/// [`MAX_CATALOG_PAGES`] pages, or at a repeated cursor (server bugs or
/// hostility that would otherwise loop forever).
async fn list_pages<T, F, Fut>(
    connection: &str,
    kind: &str,
    cap: usize,
    mut page: F,
) -> Result<Vec<T>, ServiceError>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<(Vec<T>, Option<String>), ServiceError>>,
{
    let mut items = Vec::new();
    let mut seen = HashSet::new();
    let mut cursor = None;
    for pages in 1.. {
        let (batch, next) = page(cursor.take()).await?;
        items.extend(batch);
        if items.len() > cap {
            tracing::warn!(
                connection,
                kind,
                cap,
                "catalog larger than the cap; keeping the first {cap} {kind}"
            );
            items.truncate(cap);
            break;
        }
        match next {
            Some(_) if pages >= MAX_CATALOG_PAGES => {
                tracing::warn!(
                    connection,
                    kind,
                    "server still paginating after {MAX_CATALOG_PAGES} pages; list cut short"
                );
                break;
            }
            Some(next) if seen.insert(next.clone()) => cursor = Some(next),
            Some(next) => {
                tracing::warn!(connection, kind, cursor = %next, "server repeated a pagination cursor; list cut short");
                break;
            }
            None => break,
        }
    }
    Ok(items)
}
