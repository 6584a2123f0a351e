//! A TCP proxy between a client and the server that can lose answers. Once told to lose `n`, it
//! drops what the server answers on the connection that carries it, cuts that connection a moment
//! later, and does the same to the next ones until `n` connections have lost answers. A call made
//! meanwhile reaches the server, which acts on it, and the client never hears back: the lost answer
//! of a flaky network.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct LossyProxy {
    pub url: String,
    /// Connections whose answers are still to be lost.
    losing: Arc<AtomicUsize>,
    /// Connections that lost answers so far.
    pub lost: Arc<AtomicUsize>,
}

impl LossyProxy {
    /// A proxy to `server` that cuts a connection `cut_after` its first lost answer.
    pub async fn start(server: &str, cut_after: Duration) -> Self {
        let target = server.trim_start_matches("http://").to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (losing, lost) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (to_lose, counted) = (losing.clone(), lost.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&target).await else { continue };
                let (to_lose, counted) = (to_lose.clone(), counted.clone());
                tokio::spawn(async move {
                    let (mut from_client, mut to_client) = client.into_split();
                    let (mut from_server, mut to_server) = server.into_split();
                    let up = tokio::spawn(async move { tokio::io::copy(&mut from_client, &mut to_server).await });
                    let mut buf = vec![0u8; 16 * 1024];
                    let mut cut_at = None;
                    loop {
                        let read = match cut_at {
                            Some(at) => match tokio::time::timeout_at(at, from_server.read(&mut buf)).await {
                                Ok(read) => read,
                                Err(_) => break,
                            },
                            None => from_server.read(&mut buf).await,
                        };
                        let n = match read {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if cut_at.is_none()
                            && to_lose.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
                        {
                            counted.fetch_add(1, Ordering::SeqCst);
                            cut_at = Some(tokio::time::Instant::now() + cut_after);
                        }
                        if cut_at.is_none() && to_client.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    up.abort();
                    let _ = to_client.shutdown().await;
                });
            }
        });
        Self { url, losing, lost }
    }

    /// From now on, answers are lost on `connections` connections, each cut after its first loss.
    pub fn lose(&self, connections: usize) {
        self.losing.store(connections, Ordering::SeqCst);
    }
}
