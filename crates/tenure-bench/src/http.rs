//! A plain HTTP/1.0 `GET`, for the few reads of a server's own endpoints the bench makes
//! outside any client library: etcd's `/metrics`, and the `/version` of the etcd under a
//! throwaway Kubernetes API server. HTTP/1.0 without keep-alive, so the body is
//! everything until the server closes; nothing here is worth a client dependency.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `GET path` from `host_port` over plain HTTP: the body of a 200 answer, or what went
/// wrong (never more than the status line's first 60 characters of the answer).
pub(crate) async fn get(host_port: &str, path: &str) -> Result<String, String> {
    let mut stream = TcpStream::connect(host_port)
        .await
        .map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {host_port}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| "not an HTTP response".to_owned())?;
    let status = head.lines().next().unwrap_or_default();
    if status.split(' ').nth(1) != Some("200") {
        let shown: String = status.chars().take(60).collect();
        return Err(format!("answered {shown:?}"));
    }
    Ok(body.to_owned())
}
