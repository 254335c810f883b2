//! Connecting the PostgreSQL tests to the server named by [`VAR`], directly
//! and through a fault-injecting [`Proxy`].

use std::net::SocketAddr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::{Client, NoTls};

use super::proxy::Proxy;
use super::servers;

pub const VAR: &str = "OUTBOX_TEST_POSTGRES_URL";

/// A direct client for checks, a proxy to the server and a pool of at most
/// `max_size` connections through the proxy, which waits `wait` for a
/// connection and `timeout` to create or recycle one; `None` when [`VAR`]
/// is unset.
pub async fn connect(
    test: &str,
    max_size: usize,
    wait: Duration,
    timeout: Duration,
) -> Option<(Client, Proxy, Pool)> {
    let url = servers::url(VAR, test)?;
    let config: tokio_postgres::Config = url.parse().expect("a valid postgres URL");
    let (admin, conn) = config
        .connect(NoTls)
        .await
        .unwrap_or_else(|e| panic!("{VAR}={url} is set but the server does not answer: {e}"));
    tokio::spawn(conn);
    let proxy = Proxy::start(upstream_addr(&config).await).await;

    let mut through = tokio_postgres::Config::new();
    through.host("127.0.0.1").port(proxy.addr().port());
    if let Some(user) = config.get_user() {
        through.user(user);
    }
    if let Some(db) = config.get_dbname() {
        through.dbname(db);
    }
    if let Some(password) = config.get_password() {
        through.password(password);
    }
    let manager = Manager::from_config(
        through,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(wait))
        .create_timeout(Some(timeout))
        .recycle_timeout(Some(timeout))
        .build()
        .expect("pool");
    Some((admin, proxy, pool))
}

async fn upstream_addr(config: &tokio_postgres::Config) -> SocketAddr {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let addr = tokio::net::lookup_host((host.as_str(), port))
        .await
        .expect("resolve the postgres host")
        .find(|a| a.is_ipv4())
        .expect("an IPv4 address for the postgres host");
    addr
}

pub async fn drop_table(admin: &Client, table: &str) {
    let sql = format!("DROP TABLE IF EXISTS \"{table}\"");
    admin.batch_execute(&sql).await.expect("drop the table");
}
