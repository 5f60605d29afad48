//! Guest stdout and stderr, captured in memory so they can be logged with the run
//! and shown when a test fails. Nothing reaches the host's own stdio.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// A bounded in-memory sink. Writes past the cap are counted and dropped rather
/// than failing, so a chatty guest keeps running.
#[derive(Clone, Debug)]
pub struct CapturedOutput {
    inner: Arc<Mutex<Captured>>,
}

#[derive(Debug, Default)]
struct Captured {
    bytes: Vec<u8>,
    dropped: u64,
    cap: usize,
}

impl CapturedOutput {
    pub fn new(cap: usize) -> Self {
        CapturedOutput {
            inner: Arc::new(Mutex::new(Captured {
                cap,
                ..Default::default()
            })),
        }
    }

    fn append(&self, buf: &[u8]) {
        let mut c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let room = c.cap.saturating_sub(c.bytes.len());
        let take = room.min(buf.len());
        c.bytes.extend_from_slice(&buf[..take]);
        c.dropped += (buf.len() - take) as u64;
    }

    /// What was written, as lossy UTF-8, with a note if bytes were dropped.
    pub fn contents(&self) -> String {
        let c = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut s = String::from_utf8_lossy(&c.bytes).into_owned();
        if c.dropped > 0 {
            s.push_str(&format!("\n[{} more bytes dropped]\n", c.dropped));
        }
        s
    }
}

impl IsTerminal for CapturedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl OutputStream for CapturedOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

#[async_trait::async_trait]
impl Pollable for CapturedOutput {
    async fn ready(&mut self) {}
}

impl AsyncWrite for CapturedOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.append(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
