//! Writes the generated gRPC code that pdp-injector checks in, or with `--check` fails when the checked-in code
//! differs from what the protos generate now. Needs `protoc` (Debian: protobuf-compiler, libprotobuf-dev).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// One generated module: its proto, the include root, where the checked-in code lives, whether clients are
/// generated, and whether server methods default to Unimplemented (a plugin serving part of a service).
/// Imports of google/protobuf/*.proto are found by protoc in the include directory beside it.
struct Module {
    proto: &'static str,
    include: &'static str,
    out_dir: &'static str,
    client: bool,
    default_stubs: bool,
    /// The codec: the flag sync's sizes buffers for mostly idle streams (crates/pdp-flagsync/src/codec.rs).
    codec: &'static str,
}

const MODULES: &[Module] = &[
    Module {
        proto: "crates/pdp-flagsync/proto/flagd/sync/v1/sync.proto",
        include: "crates/pdp-flagsync/proto",
        out_dir: "crates/pdp-flagsync/src/gen",
        client: true,
        default_stubs: false,
        codec: "crate::codec::SyncCodec",
    },
    Module {
        proto: "crates/pdp-flagsync/proto/pdp/relay/v1/relay.proto",
        include: "crates/pdp-flagsync/proto",
        out_dir: "crates/pdp-flagsync/src/gen",
        client: true,
        default_stubs: false,
        codec: "crate::codec::SyncCodec",
    },
    Module {
        proto: "crates/pdp-csi/src/proto/csi/csi.proto",
        include: "crates/pdp-csi/src/proto/csi",
        out_dir: "crates/pdp-csi/src/gen",
        client: false,
        default_stubs: true,
        codec: "tonic_prost::ProstCodec",
    },
    Module {
        proto: "crates/pdp-csi/src/proto/pluginregistration/api.proto",
        include: "crates/pdp-csi/src/proto/pluginregistration",
        out_dir: "crates/pdp-csi/src/gen",
        client: false,
        default_stubs: false,
        codec: "tonic_prost::ProstCodec",
    },
];

fn generate(root: &Path, module: &Module, out: &Path) -> std::io::Result<()> {
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(module.client)
        .build_transport(false)
        .generate_default_stubs(module.default_stubs)
        .codec_path(module.codec)
        .emit_rerun_if_changed(false)
        .out_dir(out)
        .compile_protos(&[root.join(module.proto)], &[root.join(module.include)])
}

fn run(check: bool) -> Result<bool, String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut same = true;
    for module in MODULES {
        let scratch = std::env::temp_dir().join(format!("protogen-{}", std::process::id()));
        std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
        generate(&root, module, &scratch).map_err(|e| format!("{}: {e}", module.proto))?;
        let mut names: Vec<_> = std::fs::read_dir(&scratch)
            .map_err(|e| e.to_string())?
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        names.sort();
        for name in names {
            let fresh = std::fs::read(scratch.join(&name)).map_err(|e| e.to_string())?;
            let target = root.join(module.out_dir).join(&name);
            let current = std::fs::read(&target).ok();
            if current.as_deref() == Some(fresh.as_slice()) {
                continue;
            }
            same = false;
            if check {
                eprintln!(
                    "protogen: {} differs from what {} generates",
                    target.display(),
                    module.proto
                );
            } else {
                std::fs::write(&target, &fresh)
                    .map_err(|e| format!("{}: {e}", target.display()))?;
                eprintln!("protogen: wrote {}", target.display());
            }
        }
        let _ = std::fs::remove_dir_all(&scratch);
    }
    Ok(same)
}

fn main() -> ExitCode {
    let check = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--check") => true,
        Some(other) => {
            eprintln!("protogen: unknown argument {other:?}; usage: protogen [--check]");
            return ExitCode::from(2);
        }
    };
    match run(check) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) if !check => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!(
                "protogen: run `cargo run --manifest-path tools/protogen/Cargo.toml` and commit the result"
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("protogen: {e}");
            ExitCode::from(2)
        }
    }
}
