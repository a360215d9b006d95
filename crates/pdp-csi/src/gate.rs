//! The start-up gate: a volume is published only once the node's PDP answers a health check through the
//! front's stable socket, so an app container (which the kubelet starts only after its volumes are set up)
//! never starts before its node's PDP can answer. The check is the one an app would make: an HTTP/1.1 GET of
//! the profile's health path over the socket the volume carries (Cerbos: `/_cerbos/health` on
//! `cerbos.sock`), answered `200`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

/// What "the node's PDP answers" means for one profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    /// The front's stable socket, in the profile's directory.
    pub socket: PathBuf,
    /// The HTTP path that answers 200 when the PDP serves.
    pub path: String,
}

/// Bound on one health request (the front itself holds a connection up to its --wait while no instance is
/// ready; the gate asks again rather than wait that long on one).
const ATTEMPT: Duration = Duration::from_secs(5);

/// Waits until `ready` answers, asking every `every`, at most `timeout`; returns how long it waited, or the
/// last failure when the time is up.
pub async fn wait(ready: &Ready, timeout: Duration, every: Duration) -> Result<Duration, String> {
    let started = Instant::now();
    let deadline = started + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let failure = match tokio::time::timeout(
            ATTEMPT.min(left),
            answers(&ready.socket, &ready.path),
        )
        .await
        {
            Ok(Ok(())) => return Ok(started.elapsed()),
            Ok(Err(e)) => e,
            Err(_) => format!("no answer within {ATTEMPT:?}"),
        };
        let now = Instant::now();
        if now + every >= deadline {
            return Err(format!(
                "the node's PDP did not answer GET {} on {} within {timeout:?}: {failure}",
                ready.path,
                ready.socket.display()
            ));
        }
        tokio::time::sleep(every).await;
    }
}

/// One health request: `Ok` on a `200` status line.
async fn answers(socket: &Path, path: &str) -> Result<(), String> {
    let mut stream = UnixStream::connect(socket)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    // The status line is all that is needed: "HTTP/1.1 200 ...".
    let mut head = [0u8; 64];
    let mut filled = 0;
    while filled < 12 {
        let n = stream
            .read(&mut head[filled..])
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    let line = String::from_utf8_lossy(&head[..filled]);
    let status = line.split(' ').nth(1).unwrap_or("");
    if line.starts_with("HTTP/1.") && status == "200" {
        Ok(())
    } else {
        Err(format!(
            "answered {:?}",
            line.lines().next().unwrap_or("nothing")
        ))
    }
}
