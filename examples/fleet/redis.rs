//! A `redis-server` of the demo's own on a free port of 127.0.0.1, so the `redis-down` scenario
//! can stop it and start it again without touching anyone else's Redis.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct OwnRedis {
    port: u16,
    child: Option<Child>,
}

impl OwnRedis {
    pub fn start() -> Result<OwnRedis, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let mut own = OwnRedis { port, child: None };
        own.restart()?;
        Ok(own)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn restart(&mut self) -> Result<(), String> {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            // The tests slow it with `DEBUG SLEEP` (from 127.0.0.1 only).
            .args(["--enable-debug-command", "local"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("could not start redis-server (is it on PATH?): {e}"))?;
        self.child = Some(child);
        for _ in 0..300 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(format!(
            "redis-server did not listen on port {} within 3 s",
            self.port
        ))
    }

    /// (Used by `tests/fleet.rs`, which includes this file; the demo stops the server instead.)
    ///
    /// Freezes the server (SIGSTOP): its port still accepts connections but nothing answers, as
    /// behind a network partition or a server stalled on a slow command.
    #[allow(dead_code)]
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen server go on (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
        }
    }

    pub fn stop(&mut self) {
        self.thaw();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.stop();
    }
}
