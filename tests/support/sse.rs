//! A server-sent-events server on 127.0.0.1 written by hand (raw HTTP/1.1 over TCP), so that a
//! stream can break exactly where a test says: before its first event, after it, or never speak.
#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What the server does with one request.
#[derive(Clone, Copy, Debug)]
pub enum Answer {
    /// The head of a 200 event stream, then the connection closes: no frame.
    BreakBefore,
    /// The head and one event, then the connection closes mid-stream.
    BreakAfter,
    /// The head, then nothing for a minute.
    Silent,
    /// The head and one event, then nothing for a minute.
    SilentAfter,
    /// The head and one event, then the stream's end.
    Whole,
}

const HEAD: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
pub const EVENT: &str = "data: hello\n\n";

/// A server on 127.0.0.1 that answers its requests as `script` says (then `Whole`); returns its
/// address and the count of requests it received.
pub async fn serve(script: Vec<Answer>) -> (SocketAddr, Arc<Mutex<u32>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let script = Arc::new(Mutex::new(VecDeque::from(script)));
    let received = Arc::new(Mutex::new(0));
    let count = received.clone();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let answer = script.lock().unwrap().pop_front().unwrap_or(Answer::Whole);
            let count = count.clone();
            tokio::spawn(async move {
                // The request: a GET with no body, read up to the end of its head.
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                *count.lock().unwrap() += 1;
                let chunk = format!("{:x}\r\n{EVENT}\r\n", EVENT.len());
                let _ = socket.write_all(HEAD).await;
                match answer {
                    Answer::BreakBefore => {}
                    Answer::BreakAfter => {
                        let _ = socket.write_all(chunk.as_bytes()).await;
                        let _ = socket.flush().await;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Answer::Silent => tokio::time::sleep(Duration::from_secs(60)).await,
                    Answer::SilentAfter => {
                        let _ = socket.write_all(chunk.as_bytes()).await;
                        let _ = socket.flush().await;
                        tokio::time::sleep(Duration::from_secs(60)).await;
                    }
                    Answer::Whole => {
                        let _ = socket.write_all(chunk.as_bytes()).await;
                        let _ = socket.write_all(b"0\r\n\r\n").await;
                    }
                }
                let _ = socket.shutdown().await;
            });
        }
    });
    (addr, received)
}
