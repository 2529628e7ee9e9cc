//! Images made here, for a real runtime that can reach no registry: the sandbox ("pause") binary
//! built from C with `gcc -static`, and an OCI image-layout archive (`oci-layout`, `index.json`,
//! blobs: config, manifest, one gzip layer; sha256 digests) written by this module's own tar and
//! gzip writers, ready for `ctr images import`. Test support only.

use std::path::{Path, PathBuf};
use std::process::Command;

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
    #[error("tar entry {0:?}: name over 100 bytes")]
    LongName(String),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
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

/// A ustar archive writer (regular files and directories; names up to 100 bytes).
#[derive(Default)]
pub struct Tar {
    buf: Vec<u8>,
}

impl Tar {
    fn header(&mut self, name: &str, mode: u32, size: usize, kind: u8) -> Result<()> {
        if name.len() > 100 {
            return Err(OciError::LongName(name.to_owned()));
        }
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        let mut field = |at: usize, len: usize, v: u64| {
            let s = format!("{v:0w$o}\0", w = len - 1);
            h[at..at + len].copy_from_slice(s.as_bytes());
        };
        field(100, 8, u64::from(mode));
        field(108, 8, 0);
        field(116, 8, 0);
        field(124, 12, size as u64);
        field(136, 12, 0);
        h[148..156].copy_from_slice(b"        ");
        h[156] = kind;
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        let s = format!("{sum:06o}\0 ");
        h[148..156].copy_from_slice(s.as_bytes());
        self.buf.extend_from_slice(&h);
        Ok(())
    }

    /// Adds a directory entry (`name` ends with `/`).
    pub fn dir(&mut self, name: &str) -> Result<()> {
        self.header(name, 0o755, 0, b'5')
    }

    /// Adds a regular file.
    pub fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> Result<()> {
        self.header(name, mode, data.len(), b'0')?;
        self.buf.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.buf.extend(std::iter::repeat_n(0u8, pad));
        Ok(())
    }

    /// The archive with its two zero end blocks.
    #[must_use]
    pub fn finish(mut self) -> Vec<u8> {
        self.buf.extend(std::iter::repeat_n(0u8, 1024));
        self.buf
    }
}

/// CRC-32 (IEEE, reflected), as gzip's trailer needs.
#[must_use]
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A gzip member holding `data` in stored (uncompressed) deflate blocks: valid for every gzip
/// reader, no compressor needed.
#[must_use]
pub fn gzip_stored(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255];
    let mut chunks = data.chunks(0xffff).peekable();
    if chunks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(c) = chunks.next() {
        out.push(u8::from(chunks.peek().is_none()));
        let len = u16::try_from(c.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(c);
    }
    out.extend_from_slice(&crc32(data).to_le_bytes());
    out.extend_from_slice(&u32::try_from(data.len() & 0xffff_ffff).unwrap_or(0).to_le_bytes());
    out
}

/// `sha256:<hex>` of `data`.
#[must_use]
pub fn digest(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// One image: files of its single layer and its entrypoint.
pub struct ImageSpec<'a> {
    /// The full reference, e.g. `dranet.test/pause:1`.
    pub reference: &'a str,
    /// (path in the image without a leading `/`, mode, content); parent dirs are added.
    pub files: Vec<(String, u32, Vec<u8>)>,
    pub entrypoint: Vec<String>,
    pub env: Vec<String>,
}

/// The OCI image-layout archive of `spec` (one gzip layer), as bytes.
pub fn image_archive(spec: &ImageSpec<'_>) -> Result<Vec<u8>> {
    let mut layer = Tar::default();
    let mut dirs: Vec<String> = Vec::new();
    for (path, mode, data) in &spec.files {
        let parts: Vec<&str> = path.split('/').collect();
        for i in 1..parts.len() {
            let d = format!("{}/", parts[..i].join("/"));
            if !dirs.contains(&d) {
                layer.dir(&d)?;
                dirs.push(d);
            }
        }
        layer.file(path, *mode, data)?;
    }
    let layer = layer.finish();
    let diff_id = digest(&layer);
    let layer_gz = gzip_stored(&layer);
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": spec.entrypoint, "Env": spec.env},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "dranet-sim oci::image_archive"}],
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": digest(&config),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": digest(&layer_gz),
            "size": layer_gz.len(),
        }],
    }))?;
    let tag = spec.reference.rsplit_once(':').map_or("latest", |(_, t)| t);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(&manifest),
            "size": manifest.len(),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {
                "io.containerd.image.name": spec.reference,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    }))?;
    let mut out = Tar::default();
    out.file("oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    out.file("index.json", 0o644, &index)?;
    out.dir("blobs/")?;
    out.dir("blobs/sha256/")?;
    for blob in [&config, &manifest, &layer_gz] {
        let d = digest(blob);
        let hex = d.trim_start_matches("sha256:");
        out.file(&format!("blobs/sha256/{hex}"), 0o644, blob)?;
    }
    Ok(out.finish())
}

/// The pause image archive for `reference`: `/pause` as entrypoint.
pub fn pause_archive(pause_bin: &Path, reference: &str) -> Result<Vec<u8>> {
    let bin = std::fs::read(pause_bin).map_err(io(format!("reading {}", pause_bin.display())))?;
    image_archive(&ImageSpec {
        reference,
        files: vec![("pause".to_owned(), 0o755, bin)],
        entrypoint: vec!["/pause".to_owned()],
        env: vec!["PATH=/".to_owned()],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn tar_headers_are_ustar_with_checksums() {
        let mut t = Tar::default();
        t.file("a/b", 0o755, b"hello").unwrap();
        let b = t.finish();
        assert_eq!(b.len(), 512 + 512 + 1024);
        assert_eq!(&b[257..263], b"ustar\0");
        assert_eq!(&b[124..135], b"00000000005");
        let stored: u32 = u32::from_str_radix(std::str::from_utf8(&b[148..154]).unwrap(), 8).unwrap();
        let mut h = b[..512].to_vec();
        h[148..156].copy_from_slice(b"        ");
        assert_eq!(stored, h.iter().map(|x| u32::from(*x)).sum::<u32>());
        assert_eq!(&b[512..517], b"hello");
    }

    #[test]
    fn gzip_round_trips_through_gzip() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let gz = gzip_stored(&data);
        let dir = std::env::temp_dir().join(format!("dranet-oci-gz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("x.gz"), &gz).unwrap();
        let out = Command::new("gzip")
            .args(["-dc"])
            .arg(dir.join("x.gz"))
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.stdout, data);
    }

    #[test]
    fn archive_lists_the_layout_and_its_blobs() {
        let a = image_archive(&ImageSpec {
            reference: "dranet.test/x:2",
            files: vec![("usr/bin/x".into(), 0o755, b"bin".to_vec())],
            entrypoint: vec!["/usr/bin/x".into()],
            env: vec![],
        })
        .unwrap();
        let dir = std::env::temp_dir().join(format!("dranet-oci-t-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.tar"), &a).unwrap();
        let out = Command::new("tar")
            .arg("-tf")
            .arg(dir.join("a.tar"))
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let list = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success());
        assert!(list.contains("oci-layout"), "{list}");
        assert!(list.contains("index.json"), "{list}");
        // The directory and three blobs: config, manifest, layer.
        assert_eq!(list.matches("blobs/sha256/").count(), 4, "{list}");
    }
}
