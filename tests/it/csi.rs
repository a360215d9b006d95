//! The CSI node plugin (`csi-node`) over its real sockets, as the kubelet talks to it: gRPC over HTTP/2 on Unix
//! sockets in a temporary kubelet directory (a small client here: hyper's HTTP/2 client, the gRPC framing by
//! hand). The mount test makes a real read-only bind mount and needs root (CI runs as root; elsewhere it says
//! it cannot run, and under CI=true that fails).

use std::path::{Path, PathBuf};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use pdp_csi::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use pdp_csi::v1::volume_capability::{AccessMode, AccessType, MountVolume};
use pdp_csi::v1::*;
use pdp_csi::{self as csi, CsiNodeFlags};
use prost::Message;
use tokio::net::UnixStream;

use pdp_testkit::skip::cannot_run;

/// A directory removed at the end of the test (after any mount below it is undone).
struct TempDir(pdp_testkit::dir::TempDir);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = pdp_testkit::dir::TempDir::new(&format!("csi-{name}"));
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
        // A failed test must not leave a mount behind (nor remove_dir_all through one): every mount point below
        // the directory, deepest first.
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<&str> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| Path::new(p).starts_with(self.0.path()))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for point in points {
            let _ = rustix::mount::unmount(point, rustix::mount::UnmountFlags::DETACH);
        }
    }
}

/// The target of volume `name` of Pod `uid`, its parent created as the kubelet does.
fn pod_target(dir: &TempDir, uid: &str, name: &str) -> PathBuf {
    let volume = dir.0.join(format!(
        "kubelet/pods/{uid}/volumes/kubernetes.io~csi/{name}"
    ));
    std::fs::create_dir_all(&volume).unwrap();
    volume.join("mount")
}

/// Whether this test may mount (root); otherwise it says why it cannot run.
fn can_mount() -> bool {
    if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) != 0 {
        cannot_run("a bind mount needs root");
        return false;
    }
    true
}

/// The mount points below `dir` now.
fn mounts_below(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p).starts_with(dir))
        .map(str::to_string)
        .collect()
}

/// A running plugin: stopping it waits for it to end.
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// Starts the plugin; returns once it serves (its registration socket, bound after the CSI socket and removed
/// at its stop, is there).
async fn start(f: CsiNodeFlags) -> Running {
    let reg = f.registration_socket();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(csi::run(f, async {
        let _ = stopped.await;
    }));
    until_socket(&reg).await;
    Running { stop, task }
}

impl Running {
    async fn stop(self) {
        self.stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
}

/// The node's front: a socket in the profile's directory that answers each connection with "pdp".
fn front(dir: &TempDir) -> PathBuf {
    let socket = dir.0.join("cerbos/cerbos.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.write_all(b"pdp").await;
        }
    });
    socket
}

fn flags(dir: &TempDir) -> CsiNodeFlags {
    CsiNodeFlags {
        node_id: "node-1".into(),
        driver: csi::DRIVER.into(),
        kubelet_dir: dir.0.join("kubelet"),
        profiles: vec![
            csi::profile_flag(&format!(
                "{{name: cerbos, dir: {}}}",
                dir.0.join("cerbos").display()
            ))
            .unwrap(),
        ],
        ready_timeout: Duration::from_secs(5),
        ready_interval: Duration::from_millis(20),
        max_volumes_per_pod: 4,
        max_volumes_per_node: 1024,
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
    call_on(stream, method, request).await
}

/// One unary call over a connected stream.
async fn call_on<Req: Message, Resp: Message + Default>(
    stream: UnixStream,
    method: &str,
    request: &Req,
) -> Result<Resp, Failed> {
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
        ..Default::default()
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
    assert_eq!(probe.ready, Some(true));
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

/// A stream to `path` connected by a thread running as `uid` (its kernel credentials, which SO_PEERCRED reports,
/// are per thread); the thread ends right after, and the stream is this test's.
fn connect_as(uid: u32, path: &Path) -> UnixStream {
    let path = path.to_path_buf();
    let stream = std::thread::spawn(move || {
        rustix::thread::set_thread_res_uid(None, rustix::thread::Uid::from_raw(uid), None)
            .expect("setresuid of one thread");
        std::os::unix::net::UnixStream::connect(&path)
    })
    .join()
    .unwrap()
    .unwrap();
    stream.set_nonblocking(true).unwrap();
    UnixStream::from_std(stream).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_other_than_root_is_refused_on_both_sockets() {
    if !can_mount() {
        return;
    }
    let dir = TempDir::new("peer");
    let f = flags(&dir);
    let (reg, sock) = (f.registration_socket(), f.csi_socket());
    let plugin = start(f).await;
    until_socket(&reg).await;
    // Say the sockets' mode were widened, or the caller had CAP_DAC_OVERRIDE: the peer check alone is left.
    for s in [&reg, &sock] {
        std::fs::set_permissions(s, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    }
    let refused = |e: Failed| {
        assert_eq!(e.0, 7, "PERMISSION_DENIED expected: {e:?}");
        assert!(e.1.contains("uid 65534"), "{e:?}");
    };
    refused(
        call_on::<_, NodeGetInfoResponse>(
            connect_as(65534, &sock),
            "/csi.v1.Node/NodeGetInfo",
            &NodeGetInfoRequest {},
        )
        .await
        .unwrap_err(),
    );
    refused(
        call_on::<_, NodePublishVolumeResponse>(
            connect_as(65534, &sock),
            "/csi.v1.Node/NodePublishVolume",
            &publish_request(&dir.target()),
        )
        .await
        .unwrap_err(),
    );
    refused(
        call_on::<_, PluginInfo>(
            connect_as(65534, &reg),
            "/pluginregistration.Registration/GetInfo",
            &InfoRequest {},
        )
        .await
        .unwrap_err(),
    );
    assert!(
        !dir.target().exists(),
        "the refused publish created nothing"
    );
    // The kubelet (root) is served as before.
    let node: NodeGetInfoResponse = call(&sock, "/csi.v1.Node/NodeGetInfo", &NodeGetInfoRequest {})
        .await
        .unwrap();
    assert_eq!(node.node_id, "node-1");
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_beyond_the_bounds_per_pod_and_per_node_are_refused() {
    if !can_mount() {
        return;
    }
    let dir = TempDir::new("bounds");
    front(&dir);
    let mut f = flags(&dir);
    (f.max_volumes_per_pod, f.max_volumes_per_node) = (2, 3);
    let sock = f.csi_socket();
    let plugin = start(f).await;
    let publish = |uid: &str, name: &str| {
        let mut r = publish_request(&pod_target(&dir, uid, name));
        r.volume_id = format!("csi-{uid}-{name}");
        r
    };
    let publish_call = async |uid: &str, name: &str| {
        call::<_, NodePublishVolumeResponse>(
            &sock,
            "/csi.v1.Node/NodePublishVolume",
            &publish(uid, name),
        )
        .await
        .map(|_| ())
    };
    let exhausted = |e: Failed, says: &str| {
        assert_eq!(e.0, 8, "RESOURCE_EXHAUSTED expected: {e:?}");
        assert!(e.1.contains(says), "{says}: {e:?}");
    };
    publish_call("uid1", "v0").await.unwrap();
    publish_call("uid1", "v1").await.unwrap();
    exhausted(
        publish_call("uid1", "v2").await.unwrap_err(),
        "Pod uid1 already has 2 volumes",
    );
    publish_call("uid2", "v0").await.unwrap();
    exhausted(
        publish_call("uid3", "v0").await.unwrap_err(),
        "this node already has 3 volumes",
    );
    for refused in [("uid1", "v2"), ("uid3", "v0")] {
        assert!(
            !pod_target(&dir, refused.0, refused.1).exists(),
            "{refused:?}"
        );
    }
    assert_eq!(mounts_below(dir.0.path()).len(), 3);
    // An unpublished volume gives its place back.
    let _: NodeUnpublishVolumeResponse = call(
        &sock,
        "/csi.v1.Node/NodeUnpublishVolume",
        &NodeUnpublishVolumeRequest {
            volume_id: "csi-uid2-v0".into(),
            target_path: pod_target(&dir, "uid2", "v0").display().to_string(),
        },
    )
    .await
    .unwrap();
    publish_call("uid3", "v0").await.unwrap();
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_volume_it_published_is_unpublished_even_after_a_restart() {
    if !can_mount() {
        return;
    }
    let dir = TempDir::new("owned");
    front(&dir);
    let plugin = start(flags(&dir)).await;
    let sock = flags(&dir).csi_socket();
    let ours = dir.target();
    let _: NodePublishVolumeResponse = call(
        &sock,
        "/csi.v1.Node/NodePublishVolume",
        &publish_request(&ours),
    )
    .await
    .unwrap();
    // Another driver's volume of another Pod, mounted; and a directory of a third Pod, not mounted.
    let theirs = pod_target(&dir, "uid2", "data");
    std::fs::create_dir(&theirs).unwrap();
    rustix::mount::mount(
        "tmpfs",
        theirs.as_path(),
        "tmpfs",
        rustix::mount::MountFlags::empty(),
        None,
    )
    .unwrap();
    std::fs::write(theirs.join("file"), b"kept").unwrap();
    let plain = pod_target(&dir, "uid3", "data");
    std::fs::create_dir(&plain).unwrap();
    let unpublish = |target: &Path| NodeUnpublishVolumeRequest {
        volume_id: "csi-0123".into(),
        target_path: target.display().to_string(),
    };
    for target in [&theirs, &plain] {
        let err = call::<_, NodeUnpublishVolumeResponse>(
            &sock,
            "/csi.v1.Node/NodeUnpublishVolume",
            &unpublish(target),
        )
        .await
        .unwrap_err();
        assert_eq!(err.0, 7, "PERMISSION_DENIED expected: {err:?}");
        assert!(err.1.contains("not published by this plugin"), "{err:?}");
    }
    assert_eq!(std::fs::read(theirs.join("file")).unwrap(), b"kept");
    assert!(mounts_below(dir.0.path()).contains(&theirs.display().to_string()));
    assert!(plain.is_dir());

    // A new process knows what the old one published.
    plugin.stop().await;
    let plugin = start(flags(&dir)).await;
    let _: NodeUnpublishVolumeResponse =
        call(&sock, "/csi.v1.Node/NodeUnpublishVolume", &unpublish(&ours))
            .await
            .unwrap();
    assert!(!ours.exists());
    assert!(!mounts_below(dir.0.path()).contains(&ours.display().to_string()));
    // Gone already: success again (the kubelet retries).
    let _: NodeUnpublishVolumeResponse =
        call(&sock, "/csi.v1.Node/NodeUnpublishVolume", &unpublish(&ours))
            .await
            .unwrap();
    plugin.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_swapped_in_while_the_gate_waits_redirects_no_mount() {
    if !can_mount() {
        return;
    }
    let dir = TempDir::new("swap");
    let elsewhere = dir.0.join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let volume = dir
        .0
        .join("kubelet/pods/uid1/volumes/kubernetes.io~csi/pdp");
    // The PDP's first health answer comes after the volume's directory was swapped for a link elsewhere.
    let listener = tokio::net::UnixListener::bind(dir.0.join("cerbos/cerbos.sock")).unwrap();
    let (swap_volume, swap_to) = (volume.clone(), elsewhere.clone());
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut first = true;
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.read(&mut [0u8; 512]).await;
            let status = if first {
                std::fs::rename(&swap_volume, swap_volume.with_extension("moved")).unwrap();
                std::os::unix::fs::symlink(&swap_to, &swap_volume).unwrap();
                first = false;
                "503 Service Unavailable"
            } else {
                "200 OK"
            };
            let _ = s
                .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                .await;
        }
    });
    let mut f = flags(&dir);
    f.profiles = vec![
        csi::profile_flag(&format!(
            "{{name: cerbos, dir: {}, readySocket: cerbos.sock, readyPath: /health}}",
            dir.0.join("cerbos").display()
        ))
        .unwrap(),
    ];
    let sock = f.csi_socket();
    let plugin = start(f).await;
    let err = call::<_, NodePublishVolumeResponse>(
        &sock,
        "/csi.v1.Node/NodePublishVolume",
        &publish_request(&dir.target()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.0, 3, "INVALID_ARGUMENT expected: {err:?}");
    assert!(err.1.contains("symbolic link"), "{err:?}");
    assert!(
        !elsewhere.join("mount").exists(),
        "nothing created through the link"
    );
    assert_eq!(mounts_below(dir.0.path()), Vec::<String>::new());
    plugin.stop().await;
}
