//! Raw clients for abusing an admission port: TLS with a chosen CA and server name,
//! HTTP/1.1 heads and HTTP/2 frames written by hand (a conforming client would not send
//! them). Used by tests/local/abuse.rs against in-process servers and by tests/node/soak against a
//! guard pod.

use std::{net::SocketAddr, path::Path, sync::Arc};

use rustls::{
    ClientConfig, RootCertStore, SupportedProtocolVersion,
    pki_types::{CertificateDer, ServerName, pem::PemObject},
};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tokio_rustls::{TlsConnector, client::TlsStream};

/// A TLS client trusting only `ca_dir/ca.crt`, with these versions and ALPN protocols.
pub fn tls_config(ca_dir: &Path, versions: &[&'static SupportedProtocolVersion], alpn: &[&[u8]]) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(ca_dir.join("ca.crt")).unwrap())
        .unwrap();
    let mut config = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A TLS connection to `addr` for `localhost`, the in-process servers' name.
pub async fn tls_connect(addr: SocketAddr, config: Arc<ClientConfig>) -> std::io::Result<TlsStream<TcpStream>> {
    tls_connect_as(addr, "localhost", config).await
}

/// A TLS connection to `addr`, checking that its certificate is `server_name`'s.
pub async fn tls_connect_as(
    addr: SocketAddr,
    server_name: &str,
    config: Arc<ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(server_name.to_owned()).map_err(std::io::Error::other)?;
    TlsConnector::from(config).connect(name, tcp).await
}

/// The head of an HTTP/1.1 POST of `length` bytes to `/validate`.
pub fn post_head(length: usize) -> String {
    format!(
        "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
}

/// An HTTP/2 frame: type, flags, stream id and payload.
pub type Frame = (u8, u8, u32, Vec<u8>);

pub const HEADERS: u8 = 0x1;
pub const RST_STREAM: u8 = 0x3;
pub const SETTINGS: u8 = 0x4;
pub const PING: u8 = 0x6;
pub const GOAWAY: u8 = 0x7;
pub const CONTINUATION: u8 = 0x9;
pub const END_HEADERS: u8 = 0x4;
pub const ACK: u8 = 0x1;
pub const REFUSED_STREAM: u32 = 0x7;

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut frame = length[1..].to_vec();
    frame.extend([kind, flags]);
    frame.extend(stream.to_be_bytes());
    frame.extend(payload);
    frame
}

pub async fn read_frame(stream: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Frame> {
    let mut head = [0; 9];
    stream.read_exact(&mut head).await?;
    let length = usize::try_from(u32::from_be_bytes([0, head[0], head[1], head[2]])).unwrap();
    let mut payload = vec![0; length];
    stream.read_exact(&mut payload).await?;
    let id = u32::from_be_bytes(head[5..9].try_into().unwrap()) & 0x7fff_ffff;
    Ok((head[3], head[4], id, payload))
}

/// A POST to /validate as an HPACK block, literals only: `:method POST`, `:scheme https`,
/// `:path /validate`, `:authority localhost`; no END_STREAM, so the body is still to come.
pub fn post_headers_block() -> Vec<u8> {
    let mut block = vec![0x83, 0x87, 0x04, 9];
    block.extend(b"/validate");
    block.extend([0x01, 9]);
    block.extend(b"localhost");
    block
}

/// What the server said it accepts on an HTTP/2 connection.
pub struct Http2Settings {
    pub max_streams: u32,
    pub stream_window: u32,
    pub connection_window: u32,
    pub max_frame: u32,
    pub max_header_list: u32,
}

/// Starts HTTP/2 by hand and learns the server's settings: everything it sends before it
/// answers a PING, which includes its SETTINGS and the connection's WINDOW_UPDATE.
pub async fn http2_handshake(tls: &mut TlsStream<TcpStream>) -> Http2Settings {
    const WINDOW_UPDATE: u8 = 0x8;
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
    tls.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    tls.write_all(&frame(PING, 0, 0, &[0; 8])).await.unwrap();
    tls.flush().await.unwrap();
    let mut settings = Http2Settings {
        max_streams: u32::MAX,
        stream_window: 65_535,
        connection_window: 65_535,
        max_frame: 16_384,
        max_header_list: 16_384,
    };
    loop {
        let (kind, flags, stream, payload) = read_frame(tls).await.unwrap();
        match kind {
            SETTINGS if flags & ACK == 0 => {
                for setting in payload.chunks(6) {
                    let value = u32::from_be_bytes(setting[2..].try_into().unwrap());
                    match setting[..2] {
                        [0, 3] => settings.max_streams = value,
                        [0, 4] => settings.stream_window = value,
                        [0, 5] => settings.max_frame = value,
                        [0, 6] => settings.max_header_list = value,
                        _ => {}
                    }
                }
                tls.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
            }
            WINDOW_UPDATE if stream == 0 => {
                settings.connection_window += u32::from_be_bytes(payload[..4].try_into().unwrap()) & 0x7fff_ffff;
            }
            PING if flags & ACK != 0 => return settings,
            _ => {}
        }
    }
}

/// An HPACK string literal (no Huffman coding): its length as a 7-bit-prefix integer,
/// then its bytes.
pub fn hpack_string(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut length = bytes.len();
    if length < 127 {
        out.push(u8::try_from(length).unwrap());
    } else {
        out.push(127);
        length -= 127;
        while length >= 128 {
            out.push(u8::try_from(length % 128 + 128).unwrap());
            length /= 128;
        }
        out.push(u8::try_from(length).unwrap());
    }
    out.extend(bytes);
    out
}

/// Fills what one HTTP/2 connection may make the server hold: `streams` streams (at most
/// what it allows), each with headers as large as it allows and no body yet, and as much
/// body data as the flow-control windows let through. Returns the bytes sent.
pub async fn fill_http2_connection(tls: &mut TlsStream<TcpStream>, streams: u32) -> usize {
    let settings = http2_handshake(tls).await;
    // What the header list size counts for the four pseudo-headers and the padding
    // header's name (RFC 9113 6.5.2: name, value and 32 bytes per header), rounded up.
    const OVERHEAD: usize = 256;
    let padding = vec![b'a'; usize::try_from(settings.max_header_list).unwrap() - OVERHEAD];
    let mut block = post_headers_block();
    block.push(0x00); // literal header, new name, not indexed
    block.extend(hpack_string(b"x-padding"));
    block.extend(hpack_string(&padding));
    let streams = settings.max_streams.min(streams);
    let mut out = Vec::new();
    let mut connection_window = settings.connection_window;
    let fragments: Vec<&[u8]> = block.chunks(usize::try_from(settings.max_frame).unwrap()).collect();
    for stream in (0..streams).map(|n| 2 * n + 1) {
        // HEADERS, then CONTINUATION frames; the last one ends the header block.
        for (n, fragment) in fragments.iter().enumerate() {
            let kind = if n == 0 { HEADERS } else { CONTINUATION };
            let flags = if n + 1 == fragments.len() { END_HEADERS } else { 0 };
            out.extend(frame(kind, flags, stream, fragment));
        }
        let mut data = settings.stream_window.min(connection_window);
        connection_window -= data;
        while data > 0 {
            let size = data.min(settings.max_frame);
            out.extend(frame(0x0, 0, stream, &vec![b' '; usize::try_from(size).unwrap()]));
            data -= size;
        }
    }
    tls.write_all(&out).await.unwrap();
    tls.flush().await.unwrap();
    out.len()
}

/// Sends a request head announcing a body of `body_limit` bytes on `tls`, then all of the
/// body but its last 4 KiB, and stalls.
pub async fn slow_body(mut tls: TlsStream<TcpStream>, body_limit: usize) -> TlsStream<TcpStream> {
    tls.write_all(post_head(body_limit).as_bytes()).await.unwrap();
    tls.write_all(&vec![b' '; body_limit - 4096]).await.unwrap();
    tls.flush().await.unwrap();
    tls
}
