//! The PostgreSQL store: shared by every worker pointed at one database.

use super::StoreError;

/// The PostgreSQL store.
pub struct PgStore {}

impl PgStore {
    pub async fn open(url: &str) -> Result<super::sqlite::SqliteStore, StoreError> {
        Err(StoreError::Open {
            path: url.to_owned(),
            message: "not built yet".into(),
        })
    }
}
