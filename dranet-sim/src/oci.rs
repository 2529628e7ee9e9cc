//! Images made here, for a real runtime that can reach no registry: the sandbox ("pause") binary
//! built from C with `gcc -static`, packed as an OCI image-layout archive by `dranet-oci` (our own
//! tar, gzip and sha256 code, shared with `cargo xtask image`, re-exported here), ready for `ctr
//! images import`. Test support only.

use std::path::{Path, PathBuf};
use std::process::Command;

pub use dranet_oci::*;
use serde_json::json;

/// The sandbox process: sleeps until SIGTERM or SIGINT (exit 0), reaps children meanwhile.
pub const PAUSE_C: &str = r#"#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t done;

static void stop(int sig) { (void)sig; done = 1; }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, 0, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction a = {0};
    a.sa_handler = stop;
    sigaction(SIGTERM, &a, 0);
    sigaction(SIGINT, &a, 0);
    a.sa_handler = reap;
    a.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &a, 0);
    while (!done) {
        pause();
    }
    return 0;
}
"#;

/// The errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("{cmd} failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error(transparent)]
    Oci(#[from] dranet_oci::OciError),
}

type Result<T> = std::result::Result<T, OciError>;

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> OciError {
    let what = what.to_string();
    move |e| OciError::Io(what, e)
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().map_err(io(format!("spawning {cmd:?}")))?;
    if !out.status.success() {
        return Err(OciError::Command {
            cmd: format!("{cmd:?}"),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// Builds the static pause binary into `dir` (unless it is there already, from this source).
pub fn build_pause(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let src = dir.join("pause.c");
    let bin = dir.join("pause");
    let same = std::fs::read_to_string(&src).is_ok_and(|s| s == PAUSE_C);
    if same && bin.exists() {
        return Ok(bin);
    }
    // Source and binary under temporary names, renamed into place: concurrent tests never see
    // a half-written file.
    let tag = crate::kernel::unique("");
    let tmp_src = dir.join(format!("pause.{tag}.c"));
    std::fs::write(&tmp_src, PAUSE_C).map_err(io("writing pause.c"))?;
    let tmp = dir.join(format!("pause.{tag}"));
    let built = run(Command::new("gcc")
        .args(["-static", "-Os", "-s", "-o"])
        .arg(&tmp)
        .arg(&tmp_src));
    if let Err(e) = built {
        let _ = std::fs::remove_file(&tmp_src);
        return Err(e);
    }
    std::fs::rename(&tmp_src, &src).map_err(io("renaming pause.c"))?;
    std::fs::rename(&tmp, &bin).map_err(io("renaming the pause binary"))?;
    Ok(bin)
}

/// The pause image archive for `reference`: `/pause` as entrypoint.
pub fn pause_archive(pause_bin: &Path, reference: &str) -> Result<Vec<u8>> {
    let bin = std::fs::read(pause_bin).map_err(io(format!("reading {}", pause_bin.display())))?;
    let mut tree = Tree::default();
    tree.file("pause", 0o755, bin);
    let layer = Layer::from_tar(&tree.to_tar()?, "dranet-sim oci::pause_archive");
    Ok(image_archive(&ImageSpec {
        reference,
        layers: vec![layer],
        config: json!({"Entrypoint": ["/pause"], "Env": ["PATH=/"]}),
    })?
    .bytes)
}
