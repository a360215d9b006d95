use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use tonic::Code;

use super::*;
use crate::v1::VolumeCapability;
use crate::v1::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};

/// Records mounts in memory: the request handling without root.
#[derive(Default)]
struct FakeMounts {
    mounted: Mutex<HashSet<PathBuf>>,
    binds: AtomicUsize,
}

impl Mounter for Arc<FakeMounts> {
    fn is_mounted(&self, parent: &Dir, name: &str) -> Result<bool, WalkError> {
        Ok(self
            .mounted
            .lock()
            .unwrap()
            .contains(&parent.path().join(name)))
    }
    fn bind_read_only(&self, _: &Path, parent: &Dir, name: &str) -> std::io::Result<()> {
        self.binds.fetch_add(1, Ordering::SeqCst);
        self.mounted
            .lock()
            .unwrap()
            .insert(parent.path().join(name));
        Ok(())
    }
    fn unmount(&self, parent: &Dir, name: &str) -> std::io::Result<()> {
        self.mounted
            .lock()
            .unwrap()
            .remove(&parent.path().join(name));
        Ok(())
    }
}

struct Fixture {
    root: PathBuf,
    mounts: Arc<FakeMounts>,
    plugin: Plugin,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn fixture(name: &str) -> Fixture {
    let root = std::env::temp_dir().join(format!("pdp-csi-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("kubelet/pods/uid1/volumes/kubernetes.io~csi/pdp")).unwrap();
    std::fs::create_dir_all(root.join("cerbos")).unwrap();
    let mounts = Arc::new(FakeMounts::default());
    let settings = Settings {
        driver: "csi.pdp-injector.io".into(),
        node_id: "node-1".into(),
        pods_dir: root.join("kubelet/pods"),
        profiles: vec![
            Profile {
                name: "cerbos".into(),
                dir: root.join("cerbos"),
                ready: None,
            },
            Profile {
                name: "flagd".into(),
                dir: root.join("flagd-missing"),
                ready: None,
            },
        ],
        ready_timeout: Duration::from_millis(200),
        ready_interval: Duration::from_millis(20),
        endpoint: root.join("kubelet/plugins/csi.pdp-injector.io/csi.sock"),
        state_dir: root.join("state"),
        max_volumes_per_pod: 4,
        max_volumes_per_node: 1024,
    };
    let plugin = Plugin::new(settings, Box::new(mounts.clone()));
    Fixture {
        root,
        mounts,
        plugin,
    }
}

impl Fixture {
    fn target(&self) -> String {
        self.root
            .join("kubelet/pods/uid1/volumes/kubernetes.io~csi/pdp/mount")
            .display()
            .to_string()
    }
}

fn request(target: &str) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: "csi-abc".into(),
        target_path: target.into(),
        volume_capability: Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode { mode: 1 }),
        }),
        readonly: true,
        volume_context: HashMap::from([
            (
                "csi.storage.k8s.io/ephemeral".to_string(),
                "true".to_string(),
            ),
            ("csi.storage.k8s.io/pod.name".to_string(), "app".to_string()),
        ]),
        ..Default::default()
    }
}

#[tokio::test]
async fn publish_and_unpublish_are_idempotent() {
    let f = fixture("idem");
    let target = f.target();
    f.plugin.publish(request(&target)).await.unwrap();
    assert!(
        Path::new(&target).is_dir(),
        "the target directory is created"
    );
    f.plugin.publish(request(&target)).await.unwrap();
    assert_eq!(
        f.mounts.binds.load(Ordering::SeqCst),
        1,
        "published once, answered twice"
    );
    let unpublish = NodeUnpublishVolumeRequest {
        volume_id: "csi-abc".into(),
        target_path: target.clone(),
    };
    f.plugin.unpublish(unpublish.clone()).await.unwrap();
    assert!(
        !Path::new(&target).exists(),
        "the target directory is removed"
    );
    assert!(f.mounts.mounted.lock().unwrap().is_empty());
    f.plugin.unpublish(unpublish.clone()).await.unwrap();
    // The whole Pod directory gone (the kubelet removed it): still success.
    std::fs::remove_dir_all(f.root.join("kubelet/pods/uid1")).unwrap();
    f.plugin.unpublish(unpublish).await.unwrap();
}

#[tokio::test]
async fn bad_requests_get_their_grpc_codes() {
    let f = fixture("codes");
    let target = f.target();
    let code = |r: Result<NodePublishVolumeResponse, Status>| {
        r.map(|_| ())
            .map_err(|s| (s.code(), s.message().to_string()))
    };
    type Change = Box<dyn Fn(&mut NodePublishVolumeRequest)>;
    let cases: Vec<(Change, Code, &str)> = vec![
        (
            Box::new(|r| r.volume_id.clear()),
            Code::InvalidArgument,
            "volume_id",
        ),
        (
            Box::new(|r| r.target_path.clear()),
            Code::InvalidArgument,
            "target_path",
        ),
        (
            Box::new(|r| r.volume_capability = None),
            Code::InvalidArgument,
            "volume_capability",
        ),
        (
            Box::new(|r| {
                r.volume_capability.as_mut().unwrap().access_type =
                    Some(AccessType::Block(BlockVolume {}))
            }),
            Code::InvalidArgument,
            "block",
        ),
        (
            Box::new(|r| {
                r.volume_capability.as_mut().unwrap().access_type =
                    Some(AccessType::Mount(MountVolume {
                        fs_type: "ext4".into(),
                        ..Default::default()
                    }))
            }),
            Code::InvalidArgument,
            "fs_type",
        ),
        (
            Box::new(|r| {
                r.volume_capability.as_mut().unwrap().access_mode = Some(AccessMode { mode: 5 })
            }),
            Code::InvalidArgument,
            "access mode 5",
        ),
        (
            Box::new(|r| r.readonly = false),
            Code::InvalidArgument,
            "readOnly: true",
        ),
        (
            Box::new(|r| {
                r.volume_context.remove("csi.storage.k8s.io/ephemeral");
            }),
            Code::InvalidArgument,
            "inline",
        ),
        // A path is never taken from the request: an attribute naming one is refused.
        (
            Box::new(|r| {
                r.volume_context.insert("dir".into(), "/etc".into());
            }),
            Code::InvalidArgument,
            "\"dir\" is not known",
        ),
        (
            Box::new(|r| {
                r.volume_context.insert("profile".into(), "../etc".into());
            }),
            Code::InvalidArgument,
            "names no profile",
        ),
        (
            Box::new(|r| {
                r.target_path = "/etc/kubernetes/volumes/kubernetes.io~csi/x/mount".into()
            }),
            Code::InvalidArgument,
            "not under",
        ),
        (
            Box::new(|r| r.target_path.push_str("/../../../../../../../etc")),
            Code::InvalidArgument,
            "'..'",
        ),
        (
            Box::new(|r| {
                r.target_path = r.target_path.replace("uid1", "uid-missing");
            }),
            Code::NotFound,
            "does not exist",
        ),
        (
            Box::new(|r| {
                r.volume_context.insert("profile".into(), "flagd".into());
            }),
            Code::FailedPrecondition,
            "flagd-missing",
        ),
    ];
    for (change, want, says) in cases {
        let mut r = request(&target);
        change(&mut r);
        let (got, message) = code(f.plugin.publish(r).await).unwrap_err();
        assert_eq!(got, want, "{says}: {message}");
        assert!(message.contains(says), "{says}: {message}");
    }
    assert_eq!(
        f.mounts.binds.load(Ordering::SeqCst),
        0,
        "no refused request mounted anything"
    );
    assert!(
        !Path::new(&target).exists(),
        "no refused request created the target"
    );
    // The named default profile is accepted like the implicit one.
    let mut r = request(&target);
    r.volume_context.insert("profile".into(), "cerbos".into());
    f.plugin.publish(r).await.unwrap();
}

#[tokio::test]
async fn a_symbolic_link_on_the_way_to_the_target_is_refused() {
    let f = fixture("link");
    // The volume's directory replaced by a link to somewhere else on the node.
    let volume = f
        .root
        .join("kubelet/pods/uid1/volumes/kubernetes.io~csi/pdp");
    std::fs::remove_dir(&volume).unwrap();
    std::fs::create_dir_all(f.root.join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(f.root.join("elsewhere"), &volume).unwrap();
    let err = f.plugin.publish(request(&f.target())).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("symbolic link"), "{err:?}");
    assert!(
        !f.root.join("elsewhere/mount").exists(),
        "nothing created through the link"
    );
    // The target itself a link.
    std::fs::remove_file(&volume).unwrap();
    std::fs::create_dir(&volume).unwrap();
    std::os::unix::fs::symlink(f.root.join("elsewhere"), volume.join("mount")).unwrap();
    let err = f.plugin.publish(request(&f.target())).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(f.mounts.binds.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_gate_holds_the_volume_until_the_pdp_answers_and_fails_past_its_bound() {
    let mut f = fixture("gate");
    let socket = f.root.join("cerbos/cerbos.sock");
    f.plugin.settings.profiles[0].ready = Some(Ready {
        socket: socket.clone(),
        path: "/_cerbos/health".into(),
    });
    // Nothing answers: Unavailable after the bound, nothing mounted.
    let err = f.plugin.publish(request(&f.target())).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("did not answer"), "{err:?}");
    assert_eq!(f.mounts.binds.load(Ordering::SeqCst), 0);
    // A PDP that answers 503 first, then 200: published after the second answer.
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = [0u8; 256];
            let _ = s.read(&mut buf).await;
            let status = if count.fetch_add(1, Ordering::SeqCst) == 0 {
                "503 Service Unavailable"
            } else {
                "200 OK"
            };
            let _ = s
                .write_all(format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n").as_bytes())
                .await;
        }
    });
    f.plugin.settings.ready_timeout = Duration::from_secs(5);
    f.plugin.publish(request(&f.target())).await.unwrap();
    assert_eq!(answered.load(Ordering::SeqCst), 2);
    assert_eq!(f.mounts.binds.load(Ordering::SeqCst), 1);
}

#[test]
fn registration_names_the_csi_socket_and_a_version_the_kubelet_speaks() {
    let f = fixture("reg");
    let info = f.plugin.info();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, "csi.pdp-injector.io");
    assert!(
        info.endpoint
            .ends_with("kubelet/plugins/csi.pdp-injector.io/csi.sock")
    );
    assert_eq!(info.supported_versions, vec!["1.0.0".to_string()]);
    assert_eq!(f.plugin.node_info().node_id, "node-1");
    // The flagd profile's directory is missing: not ready.
    assert_eq!(f.plugin.probe().ready, Some(false));
}
