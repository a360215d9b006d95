//! Inputs of the load script (`scripts/bench.sh`), generated from the same code as the criterion benchmark
//! (`benches/reviews.rs`), so every figure is measured on the same bodies.
//!
//! ```text
//! gen-reviews bodies DIR          # DIR/<class>-<size>.json for the 5 classes and 2, 22 and 80 KiB Pods
//! gen-reviews stream N FILE       # a YAML stream of N documents for offline `inject`
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use pdp_injector_bench::reviews::{Class, body};

/// The flags; `--help` prints them.
#[derive(Parser)]
#[command(
    name = "gen-reviews",
    about = "Inputs of scripts/bench.sh, from the criterion benchmark's code (benches/reviews.rs)"
)]
struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// DIR/<class>-<size>.json for the 5 classes and 2, 22 and 80 KiB Pods.
    Bodies {
        /// Created if missing.
        dir: PathBuf,
    },
    /// A YAML stream of N documents for offline `inject`.
    Stream {
        /// Number of documents (at most a million).
        #[arg(value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
        n: u32,
        /// Where to write it.
        file: PathBuf,
    },
}

const CLASSES: [(Class, &str); 5] = [
    (Class::Inject, "inject"),
    (Class::OptedOut, "opted_out"),
    (Class::AlreadyInjected, "already_injected"),
    (Class::Bare, "bare"),
    (Class::Update, "update"),
];

fn bodies(dir: &Path) -> std::io::Result<()> {
    let context = |path: &Path, e: std::io::Error| {
        std::io::Error::other(format!("cannot write {}: {e}", path.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| context(dir, e))?;
    for (size, label) in [(2 * 1024, "2k"), (22 * 1024, "22k"), (80 * 1024, "80k")] {
        for (class, name) in CLASSES {
            let bytes = body(size, class);
            let path = dir.join(format!("{name}-{label}.json"));
            std::fs::write(&path, &bytes).map_err(|e| context(&path, e))?;
            eprintln!("{} ({} bytes)", path.display(), bytes.len());
        }
    }
    Ok(())
}

/// A stream of `n` documents cycling through 10 shapes: 4 Deployments (2 annotated, one `disabled`), 3 Pods
/// (1 annotated), 3 Services. Realistic sizes (a Deployment of about 1.3 KiB).
fn stream(n: usize) -> String {
    let mut out = String::with_capacity(n * 1200);
    for i in 0..n {
        out.push_str("---\n");
        let ns = format!("team-{}", i % 17);
        match i % 10 {
            0..=3 => {
                let annotation = match i % 10 {
                    0 => "        pdp-injector.io/inject: daemonset\n",
                    1 => "        pdp-injector.io/inject: sidecar\n",
                    2 => "        pdp-injector.io/inject: disabled\n",
                    _ => "",
                };
                let _ = write!(
                    out,
                    "apiVersion: apps/v1
kind: Deployment
metadata:
  name: app-{i}
  namespace: {ns}
  labels:
    app.kubernetes.io/name: app-{i}
    app.kubernetes.io/part-of: shop
spec:
  replicas: 3
  selector:
    matchLabels:
      app.kubernetes.io/name: app-{i}
  template:
    metadata:
      labels:
        app.kubernetes.io/name: app-{i}
      annotations:
        prometheus.io/scrape: \"true\"
{annotation}    spec:
      serviceAccountName: app-{i}
      securityContext:
        runAsNonRoot: true
        seccompProfile:
          type: RuntimeDefault
      containers:
      - name: app
        image: registry.example.com/shop/app-{i}:1.2.{i}
        ports:
        - name: http
          containerPort: 8080
        env:
        - name: LOG_LEVEL
          value: info
        - name: DATABASE_URL
          valueFrom:
            secretKeyRef:
              name: app-{i}-db
              key: url
        resources:
          requests:
            cpu: 100m
            memory: 128Mi
          limits:
            memory: 256Mi
        readinessProbe:
          httpGet:
            path: /ready
            port: http
        volumeMounts:
        - name: cache
          mountPath: /cache
      - name: log-shipper
        image: registry.example.com/infra/shipper:0.9.1
        args: [\"--input\", \"/var/log/app\"]
      volumes:
      - name: cache
        emptyDir: {{}}
"
                );
            }
            4..=6 => {
                let annotations = if i % 10 == 4 {
                    "  annotations:\n    pdp-injector.io/inject: daemonset\n"
                } else {
                    ""
                };
                let _ = write!(
                    out,
                    "apiVersion: v1
kind: Pod
metadata:
  name: job-{i}
  namespace: {ns}
  labels:
    app: job-{i}
{annotations}spec:
  restartPolicy: Never
  containers:
  - name: main
    image: registry.example.com/batch/job:3.1.0
    command: [\"/bin/job\", \"--id\", \"{i}\"]
    env:
    - name: JOB_ID
      value: \"{i}\"
    resources:
      requests:
        cpu: 250m
        memory: 64Mi
"
                );
            }
            _ => {
                let _ = write!(
                    out,
                    "apiVersion: v1
kind: Service
metadata:
  name: svc-{i}
  namespace: {ns}
  labels:
    app.kubernetes.io/name: app-{i}
spec:
  selector:
    app.kubernetes.io/name: app-{i}
  ports:
  - name: http
    port: 80
    targetPort: http
"
                );
            }
        }
    }
    out
}

fn main() {
    let result = match Args::parse().what {
        What::Bodies { dir } => bodies(&dir),
        What::Stream { n, file } => std::fs::write(&file, stream(n as usize))
            .map_err(|e| std::io::Error::other(format!("cannot write {}: {e}", file.display()))),
    };
    if let Err(e) = result {
        eprintln!("gen-reviews: {e}");
        std::process::exit(1);
    }
}
