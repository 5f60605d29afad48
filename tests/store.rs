//! The store backends, each test run against SQLite and PostgreSQL.

mod common;

use common::postgres::TestPostgres;

#[test]
fn the_test_server_starts_and_stops() {
    let t = std::time::Instant::now();
    let pg = TestPostgres::start();
    eprintln!("started in {:?}", t.elapsed());
    assert_eq!(pg.psql("SELECT 1"), "1");
    let second = TestPostgres::start();
    assert_ne!(pg.url(), second.url());
    drop((pg, second));
    eprintln!("stopped after {:?}", t.elapsed());
}
