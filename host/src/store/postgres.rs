//! The PostgreSQL store: shared by every worker pointed at one database.
