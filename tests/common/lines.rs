// Shared by tests/it/node_proxy.rs and tests/hostile/main.rs: the protocol of their fake PDP instances, one line out and
// one line back.

/// Sends `text` and a newline on `stream` and reads one line back (without its newline), within `limit`.
pub async fn ask_line<S>(
    stream: &mut tokio::io::BufReader<S>,
    text: &str,
    limit: std::time::Duration,
) -> Result<String, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let exchange = async {
        stream
            .get_mut()
            .write_all(format!("{text}\n").as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut line = String::new();
        let n = stream
            .read_line(&mut line)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err("closed without a reply".to_string());
        }
        Ok(line.trim_end().to_string())
    };
    tokio::time::timeout(limit, exchange)
        .await
        .map_err(|_| format!("no reply in {limit:?}"))?
}
