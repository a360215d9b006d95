//! The CSI node plugin (`csi-node`) over its real sockets, as the kubelet talks to it: gRPC over HTTP/2 on Unix
//! sockets in a temporary kubelet directory (a small client here: hyper's HTTP/2 client, the gRPC framing by
//! hand). The mount test makes a real read-only bind mount and needs root (CI runs as root; elsewhere it says
//! it cannot run, and under CI=true that fails).

use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use pdp_injector::csi::proto::*;
use pdp_injector::csi::{self, CsiNodeFlags};
use prost::Message;
use tokio::net::UnixStream;

include!("common/skip.rs");

/// A directory removed at the end of the test (after any mount below it is undone).
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("pdp-csi-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("kubelet/pods/uid1/volumes/kubernetes.io~csi/pdp"))
            .unwrap();
        std::fs::create_dir_all(dir.join("cerbos")).unwrap();
        TempDir(dir)
    }
    fn target(&self) -> PathBuf {
        self.0
            .join("kubelet/pods/uid1/volumes/kubernetes.io~csi/pdp/mount")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // A failed test must not leave a mount behind (nor remove_dir_all through one).
        let _ =
            rustix::mount::unmount(self.target().as_path(), rustix::mount::UnmountFlags::DETACH);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn flags(dir: &TempDir) -> CsiNodeFlags {
    CsiNodeFlags {
        node_id: "node-1".into(),
        driver: csi::DRIVER.into(),
        kubelet_dir: dir.0.join("kubelet"),
        profiles: vec![
            csi::profile_flag(&format!(
                "name=cerbos,dir={}",
                dir.0.join("cerbos").display()
            ))
            .unwrap(),
        ],
        ready_timeout: Duration::from_secs(5),
        ready_interval: Duration::from_millis(20),
    }
}

/// A gRPC status: its code and message.
#[derive(Debug)]
struct Failed(i32, String);

/// One unary call over a Unix socket.
async fn call<Req: Message, Resp: Message + Default>(
    socket: &Path,
    method: &str,
    request: &Req,
) -> Result<Resp, Failed> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|e| Failed(-1, e.to_string()))?;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| Failed(-1, e.to_string()))?;
    tokio::spawn(conn);
    let message = request.encode_to_vec();
    let mut body = vec![0u8];
    body.extend((message.len() as u32).to_be_bytes());
    body.extend(message);
    let http = hyper::Request::post(format!("http://localhost{method}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = sender
        .send_request(http)
        .await
        .map_err(|e| Failed(-1, e.to_string()))?;
    let (parts, body) = response.into_parts();
    let collected = body
        .collect()
        .await
        .map_err(|e| Failed(-1, e.to_string()))?;
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let data = collected.to_bytes();
    let header = |name: &str| {
        trailers
            .get(name)
            .or(parts.headers.get(name))
            .map(|v| v.to_str().unwrap_or("").to_string())
    };
    let code: i32 = header("grpc-status")
        .and_then(|s| s.parse().ok())
        .unwrap_or(-2);
    if code != 0 {
        return Err(Failed(
            code,
            percent_decoded(&header("grpc-message").unwrap_or_default()),
        ));
    }
    Resp::decode(&data[5..]).map_err(|e| Failed(-3, e.to_string()))
}

/// grpc-message is percent-encoded (gRPC over HTTP/2, "Responses").
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match (
            bytes[i],
            text.get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok()),
        ) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Waits until `path` is a socket (the plugin binds it at start).
async fn until_socket(path: &Path) {
    for _ in 0..500 {
        if std::os::unix::fs::FileTypeExt::is_socket(
            &std::fs::metadata(path)
                .map(|m| m.file_type())
                .unwrap_or_else(|_| std::fs::metadata("/").unwrap().file_type()),
        ) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} never appeared", path.display());
}

fn publish_request(target: &Path) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: "csi-0123".into(),
        target_path: target.display().to_string(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode { mode: 1 }),
        }),
        readonly: true,
        volume_context: [
            ("csi.storage.k8s.io/ephemeral", "true"),
            ("csi.storage.k8s.io/pod.name", "app"),
            ("csi.storage.k8s.io/pod.namespace", "restricted"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_registers_with_the_kubelet_and_answers_identity_and_node_calls() {
    let dir = TempDir::new("rpc");
    let f = flags(&dir);
    let (reg, sock) = (f.registration_socket(), f.csi_socket());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let plugin = tokio::spawn(csi::run(f, async {
        let _ = stopped.await;
    }));
    until_socket(&reg).await;
    assert_eq!(
        std::fs::metadata(&reg)
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o777)
            .unwrap(),
        0o600
    );

    let info: PluginInfo = call(
        &reg,
        "/pluginregistration.Registration/GetInfo",
        &InfoRequest {},
    )
    .await
    .unwrap();
    assert_eq!(
        (info.r#type.as_str(), info.name.as_str()),
        ("CSIPlugin", "csi.pdp-injector.io")
    );
    assert_eq!(PathBuf::from(&info.endpoint), sock);
    assert_eq!(info.supported_versions, vec!["1.0.0"]);
    let _: RegistrationStatusResponse = call(
        &reg,
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        &RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        },
    )
    .await
    .unwrap();

    let about: GetPluginInfoResponse = call(
        &sock,
        "/csi.v1.Identity/GetPluginInfo",
        &GetPluginInfoRequest {},
    )
    .await
    .unwrap();
    assert_eq!(about.name, "csi.pdp-injector.io");
    assert!(!about.vendor_version.is_empty());
    let probe: ProbeResponse = call(&sock, "/csi.v1.Identity/Probe", &ProbeRequest {})
        .await
        .unwrap();
    assert_eq!(probe.ready, Some(BoolValue { value: true }));
    let node: NodeGetInfoResponse = call(&sock, "/csi.v1.Node/NodeGetInfo", &NodeGetInfoRequest {})
        .await
        .unwrap();
    assert_eq!(node.node_id, "node-1");
    let _: NodeGetCapabilitiesResponse = call(
        &sock,
        "/csi.v1.Node/NodeGetCapabilities",
        &NodeGetCapabilitiesRequest {},
    )
    .await
    .unwrap();
    let _: GetPluginCapabilitiesResponse = call(
        &sock,
        "/csi.v1.Identity/GetPluginCapabilities",
        &GetPluginCapabilitiesRequest {},
    )
    .await
    .unwrap();

    // What is not served says so (12 Unimplemented); a bad request gets its code over the wire (3 InvalidArgument).
    let err = call::<_, NodePublishVolumeResponse>(
        &sock,
        "/csi.v1.Node/NodeStageVolume",
        &NodeGetInfoRequest {},
    )
    .await
    .unwrap_err();
    assert_eq!(err.0, 12, "{err:?}");
    let mut bad = publish_request(&dir.target());
    bad.volume_context.insert("dir".into(), "/".into());
    let err = call::<_, NodePublishVolumeResponse>(&sock, "/csi.v1.Node/NodePublishVolume", &bad)
        .await
        .unwrap_err();
    assert_eq!(err.0, 3, "{err:?}");
    assert!(err.1.contains("not known"), "{err:?}");

    // Stopped: the registration socket goes (the kubelet stops using the driver until it registers again).
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), plugin)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(!reg.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_volume_is_the_socket_directory_read_only_and_unpublishing_leaves_nothing() {
    if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) != 0 {
        return cannot_run("a bind mount needs root");
    }
    let dir = TempDir::new("mount");
    // The node's front: a socket in the profile's directory that answers each connection with "pdp".
    let socket = dir.0.join("cerbos/cerbos.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.write_all(b"pdp").await;
        }
    });
    let f = flags(&dir);
    let sock = f.csi_socket();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let plugin = tokio::spawn(csi::run(f, async {
        let _ = stopped.await;
    }));
    until_socket(&sock).await;
    let target = dir.target();
    let request = publish_request(&target);
    let _: NodePublishVolumeResponse = call(&sock, "/csi.v1.Node/NodePublishVolume", &request)
        .await
        .unwrap();

    // The app's view: the socket answers through the mount, and the mount is read-only, nosuid, nodev, noexec.
    let mut through = UnixStream::connect(target.join("cerbos.sock"))
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut through, &mut answer)
        .await
        .unwrap();
    assert_eq!(answer, "pdp");
    let write = std::fs::write(target.join("planted"), b"x").unwrap_err();
    assert_eq!(write.raw_os_error(), Some(30), "EROFS expected: {write}");
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == target.to_str())
        .expect("the target is a mount point");
    let options = line.split(' ').nth(5).unwrap();
    for want in ["ro", "nosuid", "nodev", "noexec"] {
        assert!(
            options.split(',').any(|o| o == want),
            "{want} missing: {line}"
        );
    }
    // Publishing again answers success and mounts nothing more.
    let _: NodePublishVolumeResponse = call(&sock, "/csi.v1.Node/NodePublishVolume", &request)
        .await
        .unwrap();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert_eq!(
        info.lines()
            .filter(|l| l.split(' ').nth(4) == target.to_str())
            .count(),
        1
    );

    let unpublish = NodeUnpublishVolumeRequest {
        volume_id: "csi-0123".into(),
        target_path: target.display().to_string(),
    };
    let _: NodeUnpublishVolumeResponse =
        call(&sock, "/csi.v1.Node/NodeUnpublishVolume", &unpublish)
            .await
            .unwrap();
    assert!(!target.exists(), "the target directory is gone");
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!info.contains(target.to_str().unwrap()), "no mount left");
    assert!(socket.exists(), "the node's socket is untouched");
    let _: NodeUnpublishVolumeResponse =
        call(&sock, "/csi.v1.Node/NodeUnpublishVolume", &unpublish)
            .await
            .unwrap();

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), plugin)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
