//! OCI images without Docker or a registry: an OCI image-layout archive (`oci-layout`,
//! `index.json`, blobs: config, manifest, gzip layers; sha256 digests) written by this crate's
//! own ustar and gzip writers, ready for `ctr images import`. Deterministic: every tar entry has
//! mtime 0, uid/gid 0 and no user names, entries come in the order given (sorted where built from
//! a map), and nothing in the config carries a date, so the same input gives the same digests.
//!
//! Used by `cargo xtask image` (the dranet image) and by the node simulator (the tests' pause
//! image, and the image test's copy of the dranet image with the binary under test).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

/// The errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("tar entry {0:?}: name does not fit a ustar header (100 bytes, or 155 + 100 split at a /)")]
    LongName(String),
    #[error("tar entry {0:?}: link target over 100 bytes")]
    LongLink(String),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("not a valid archive: {0}")]
    Malformed(String),
}

type Result<T> = std::result::Result<T, OciError>;

fn io(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> OciError {
    let what = what.to_string();
    move |e| OciError::Io(what, e)
}

/// Splits `name` into ustar (prefix, name): the whole name when it fits 100 bytes, else at a `/`
/// with at most 155 bytes before and 100 after.
fn split_name(name: &str) -> Result<(&str, &str)> {
    if name.len() <= 100 {
        return Ok(("", name));
    }
    // A directory's trailing '/' belongs to the name part.
    let body = name.strip_suffix('/').unwrap_or(name);
    body.char_indices()
        .filter(|(_, c)| *c == '/')
        .map(|(i, _)| i)
        .find(|&i| i <= 155 && name.len() - i - 1 <= 100 && i + 1 < name.len())
        .map(|i| (&name[..i], &name[i + 1..]))
        .ok_or_else(|| OciError::LongName(name.to_owned()))
}

/// A ustar archive writer: regular files, directories and symlinks.
#[derive(Default)]
pub struct Tar {
    buf: Vec<u8>,
}

impl Tar {
    fn header(&mut self, name: &str, mode: u32, size: usize, kind: u8, link: &str) -> Result<()> {
        let (prefix, short) = split_name(name)?;
        if link.len() > 100 {
            return Err(OciError::LongLink(name.to_owned()));
        }
        let mut h = [0u8; 512];
        h[..short.len()].copy_from_slice(short.as_bytes());
        let mut field = |at: usize, len: usize, v: u64| {
            let s = format!("{v:0w$o}\0", w = len - 1);
            h[at..at + len].copy_from_slice(s.as_bytes());
        };
        field(100, 8, u64::from(mode & 0o7777));
        field(108, 8, 0);
        field(116, 8, 0);
        field(124, 12, size as u64);
        field(136, 12, 0);
        h[148..156].copy_from_slice(b"        ");
        h[156] = kind;
        h[157..157 + link.len()].copy_from_slice(link.as_bytes());
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        let s = format!("{sum:06o}\0 ");
        h[148..156].copy_from_slice(s.as_bytes());
        self.buf.extend_from_slice(&h);
        Ok(())
    }

    /// Adds a directory entry (`name` ends with `/`).
    pub fn dir(&mut self, name: &str, mode: u32) -> Result<()> {
        self.header(name, mode, 0, b'5', "")
    }

    /// Adds a regular file.
    pub fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> Result<()> {
        self.header(name, mode, data.len(), b'0', "")?;
        self.buf.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.buf.extend(std::iter::repeat_n(0u8, pad));
        Ok(())
    }

    /// Adds a symbolic link `name` → `target`.
    pub fn symlink(&mut self, name: &str, target: &str) -> Result<()> {
        self.header(name, 0o777, 0, b'2', target)
    }

    /// The archive with its two zero end blocks.
    #[must_use]
    pub fn finish(mut self) -> Vec<u8> {
        self.buf.extend(std::iter::repeat_n(0u8, 1024));
        self.buf
    }
}

/// One entry of a file system tree for a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir { mode: u32 },
    File { mode: u32, data: Vec<u8> },
    Symlink { target: String },
}

/// A layer's tree: paths without a leading `/` (directories without a trailing one), written in
/// sorted order with every missing parent directory added (0755).
#[derive(Debug, Default, Clone)]
pub struct Tree {
    pub nodes: BTreeMap<String, Node>,
}

impl Tree {
    /// Adds (or replaces) `path`.
    pub fn insert(&mut self, path: &str, node: Node) {
        let path = path.trim_matches('/');
        if !path.is_empty() {
            self.nodes.insert(path.to_owned(), node);
        }
    }

    /// Adds a regular file.
    pub fn file(&mut self, path: &str, mode: u32, data: Vec<u8>) {
        self.insert(path, Node::File { mode, data });
    }

    /// Adds everything under `root` (a directory on disk: directories, regular files, symlinks;
    /// other kinds are skipped), each at `map(relative path)` or left out where `map` says
    /// `None`. Modes are kept (permission, setuid/setgid/sticky bits); owners and times are not.
    pub fn add_dir(&mut self, root: &Path, map: &dyn Fn(&str) -> Option<String>) -> Result<()> {
        let mut stack = vec![root.to_path_buf()];
        while let Some(d) = stack.pop() {
            let rd = std::fs::read_dir(&d).map_err(io(format!("reading {}", d.display())))?;
            for e in rd {
                let e = e.map_err(io(format!("reading {}", d.display())))?;
                let p = e.path();
                let rel = p
                    .strip_prefix(root)
                    .map_err(|_| OciError::Malformed(p.display().to_string()))?
                    .to_string_lossy()
                    .into_owned();
                let meta = std::fs::symlink_metadata(&p).map_err(io(format!("stat {}", p.display())))?;
                let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions());
                let ft = meta.file_type();
                let Some(to) = map(&rel) else {
                    continue;
                };
                if ft.is_dir() {
                    self.insert(&to, Node::Dir { mode });
                    stack.push(p);
                } else if ft.is_symlink() {
                    let target = std::fs::read_link(&p).map_err(io(format!("readlink {}", p.display())))?;
                    self.insert(
                        &to,
                        Node::Symlink {
                            target: target.to_string_lossy().into_owned(),
                        },
                    );
                } else if ft.is_file() {
                    let data = std::fs::read(&p).map_err(io(format!("reading {}", p.display())))?;
                    self.insert(&to, Node::File { mode, data });
                }
            }
        }
        Ok(())
    }

    /// The layer tar (uncompressed).
    pub fn to_tar(&self) -> Result<Vec<u8>> {
        let mut t = Tar::default();
        let mut written: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        for (path, node) in &self.nodes {
            let parts: Vec<&str> = path.split('/').collect();
            for i in 1..parts.len() {
                let parent = parts[..i].join("/");
                if !written.contains(&parent) && !self.nodes.contains_key(&parent) {
                    t.dir(&format!("{parent}/"), 0o755)?;
                    written.insert(parent);
                }
            }
            match node {
                Node::Dir { mode } => t.dir(&format!("{path}/"), *mode)?,
                Node::File { mode, data } => t.file(path, *mode, data)?,
                Node::Symlink { target } => t.symlink(path, target)?,
            }
            written.insert(path.clone());
        }
        Ok(t.finish())
    }
}

/// One entry read back from a tar archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// The ustar type flag (`b'0'` file, `b'2'` symlink, `b'5'` directory).
    pub kind: u8,
    pub mode: u32,
    pub link: String,
    pub data: Vec<u8>,
}

fn octal(field: &[u8]) -> Result<u64> {
    let s = String::from_utf8_lossy(field);
    let s = s.trim_matches(|c: char| c == '\0' || c == ' ');
    if s.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(s, 8).map_err(|_| OciError::Malformed(format!("octal field {s:?}")))
}

fn cstr(field: &[u8]) -> String {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// Reads a ustar archive (as written here, or by GNU tar without extensions).
pub fn read_tar(data: &[u8]) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 512 <= data.len() {
        let h = &data[at..at + 512];
        if h.iter().all(|b| *b == 0) {
            break;
        }
        let short = cstr(&h[..100]);
        let prefix = cstr(&h[345..500]);
        let name = if prefix.is_empty() {
            short
        } else {
            format!("{prefix}/{short}")
        };
        let size = usize::try_from(octal(&h[124..136])?)
            .map_err(|_| OciError::Malformed(format!("{name}: size")))?;
        let mode = u32::try_from(octal(&h[100..108])?).unwrap_or(0);
        let body = at + 512;
        let end = body
            .checked_add(size)
            .filter(|e| *e <= data.len())
            .ok_or_else(|| OciError::Malformed(format!("{name}: truncated")))?;
        out.push(Entry {
            name,
            kind: h[156],
            mode,
            link: cstr(&h[157..257]),
            data: data[body..end].to_vec(),
        });
        at = body + size.div_ceil(512) * 512;
    }
    Ok(out)
}

/// CRC-32 (IEEE, reflected), as gzip's trailer needs.
#[must_use]
pub fn crc32(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, slot) in (0u32..).zip(t.iter_mut()) {
            let mut c = i;
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    (c >> 1) ^ 0xEDB8_8320
                } else {
                    c >> 1
                };
            }
            *slot = c;
        }
        t
    });
    let mut crc = !0u32;
    for &b in data {
        crc = table[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// A gzip member holding `data` in stored (uncompressed) deflate blocks: valid for every gzip
/// reader, no compressor needed; no name and no time in the header.
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

/// A layer as stored: its gzip blob and the digest of the uncompressed tar (its diff id).
#[derive(Debug, Clone)]
pub struct Layer {
    pub blob: Vec<u8>,
    pub diff_id: String,
    /// What made it (the config's history entry).
    pub created_by: String,
}

impl Layer {
    /// A layer from an uncompressed tar.
    #[must_use]
    pub fn from_tar(tar: &[u8], created_by: &str) -> Self {
        Self {
            blob: gzip_stored(tar),
            diff_id: digest(tar),
            created_by: created_by.to_owned(),
        }
    }
}

/// One image: its layers (bottom first) and its runtime config (the OCI config's `config`
/// object: `Entrypoint`, `Cmd`, `Env`, `Labels`, `User`, `WorkingDir`).
pub struct ImageSpec<'a> {
    /// The full reference, e.g. `ghcr.io/dranet-rs/dranet:0.1.0`.
    pub reference: &'a str,
    pub layers: Vec<Layer>,
    pub config: Value,
}

/// The image written: the archive and its manifest's digest (the image id runtimes show).
pub struct Archive {
    pub bytes: Vec<u8>,
    pub manifest_digest: String,
}

/// The OCI image-layout archive of `spec`.
pub fn image_archive(spec: &ImageSpec<'_>) -> Result<Archive> {
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": spec.config,
        "rootfs": {
            "type": "layers",
            "diff_ids": spec.layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>(),
        },
        "history": spec.layers.iter().map(|l| json!({"created_by": l.created_by})).collect::<Vec<_>>(),
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": digest(&config),
            "size": config.len(),
        },
        "layers": spec.layers.iter().map(|l| json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": digest(&l.blob),
            "size": l.blob.len(),
        })).collect::<Vec<_>>(),
    }))?;
    let tag = spec
        .reference
        .rsplit_once(':')
        .filter(|(_, t)| !t.contains('/'))
        .map_or("latest", |(_, t)| t);
    let manifest_digest = digest(&manifest);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
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
    out.dir("blobs/", 0o755)?;
    out.dir("blobs/sha256/", 0o755)?;
    let mut blobs: Vec<&[u8]> = vec![&config, &manifest];
    blobs.extend(spec.layers.iter().map(|l| l.blob.as_slice()));
    let mut seen = Vec::new();
    for blob in blobs {
        let d = digest(blob);
        if seen.contains(&d) {
            continue;
        }
        let hex = d.trim_start_matches("sha256:");
        out.file(&format!("blobs/sha256/{hex}"), 0o644, blob)?;
        seen.push(d);
    }
    Ok(Archive {
        bytes: out.finish(),
        manifest_digest,
    })
}

/// An image archive read back: reference, runtime config, layers (with their diff ids).
#[derive(Debug)]
pub struct ReadImage {
    pub reference: String,
    pub manifest_digest: String,
    /// The OCI config's `config` object.
    pub config: Value,
    pub layers: Vec<Layer>,
}

/// Reads an archive written by [`image_archive`] (one manifest).
pub fn read_archive(bytes: &[u8]) -> Result<ReadImage> {
    let entries = read_tar(bytes)?;
    let file = |name: &str| -> Result<&[u8]> {
        entries
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.data.as_slice())
            .ok_or_else(|| OciError::Malformed(format!("no {name}")))
    };
    let blob = |d: &str| file(&format!("blobs/sha256/{}", d.trim_start_matches("sha256:")));
    let index: Value = serde_json::from_slice(file("index.json")?)?;
    let m = &index["manifests"][0];
    let manifest_digest = m["digest"].as_str().unwrap_or_default().to_owned();
    let reference = m["annotations"]["io.containerd.image.name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let manifest: Value = serde_json::from_slice(blob(&manifest_digest)?)?;
    let config: Value =
        serde_json::from_slice(blob(manifest["config"]["digest"].as_str().unwrap_or_default())?)?;
    let diff_ids = config["rootfs"]["diff_ids"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let history = config["history"].as_array().cloned().unwrap_or_default();
    let mut layers = Vec::new();
    for (i, l) in manifest["layers"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        layers.push(Layer {
            blob: blob(l["digest"].as_str().unwrap_or_default())?.to_vec(),
            diff_id: diff_ids
                .get(i)
                .and_then(Value::as_str)
                .ok_or_else(|| OciError::Malformed(format!("no diff id for layer {i}")))?
                .to_owned(),
            created_by: history
                .get(i)
                .and_then(|h| h["created_by"].as_str())
                .unwrap_or_default()
                .to_owned(),
        });
    }
    Ok(ReadImage {
        reference,
        manifest_digest,
        config: config["config"].clone(),
        layers,
    })
}

/// The uncompressed tar inside a stored-deflate gzip blob written by [`gzip_stored`].
pub fn gunzip_stored(gz: &[u8]) -> Result<Vec<u8>> {
    let bad = |w: &str| OciError::Malformed(format!("gzip: {w}"));
    if gz.len() < 18 || gz[..4] != [0x1f, 0x8b, 8, 0] {
        return Err(bad("not a plain gzip member"));
    }
    let mut at = 10;
    let mut out = Vec::new();
    loop {
        let last = *gz.get(at).ok_or_else(|| bad("truncated"))?;
        if last & 0b110 != 0 {
            return Err(bad("compressed blocks (only stored ones are read here)"));
        }
        let len = usize::from(u16::from_le_bytes([
            *gz.get(at + 1).ok_or_else(|| bad("truncated"))?,
            *gz.get(at + 2).ok_or_else(|| bad("truncated"))?,
        ]));
        let body = gz.get(at + 5..at + 5 + len).ok_or_else(|| bad("truncated"))?;
        out.extend_from_slice(body);
        at += 5 + len;
        if last & 1 == 1 {
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn tmp(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("dranet-oci-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

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
    fn long_names_symlinks_and_modes_survive_gnu_tar() {
        let long = format!("usr/share/{}/{}", "d".repeat(95), "f".repeat(90));
        let mut tree = Tree::default();
        tree.file(&long, 0o4755, b"x".to_vec());
        tree.insert(
            "bin",
            Node::Symlink {
                target: "usr/bin".into(),
            },
        );
        tree.insert("tmp", Node::Dir { mode: 0o1777 });
        let tar = tree.to_tar().unwrap();
        let back = read_tar(&tar).unwrap();
        assert!(
            back.iter()
                .any(|e| e.name == long && e.mode == 0o4755 && e.data == b"x")
        );
        assert!(
            back.iter()
                .any(|e| e.name == "bin" && e.kind == b'2' && e.link == "usr/bin")
        );
        assert!(back.iter().any(|e| e.name == "tmp/" && e.mode == 0o1777));
        let d = tmp("long");
        std::fs::write(d.join("l.tar"), &tar).unwrap();
        let out = Command::new("tar")
            .arg("-tvf")
            .arg(d.join("l.tar"))
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&d);
        let list = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(list.contains(&long), "{list}");
        assert!(list.contains("bin -> usr/bin"), "{list}");
        assert!(list.contains("drwxrwxrwt"), "{list}");
        assert!(list.contains("-rwsr-xr-x"), "{list}");
        assert!(split_name(&"x".repeat(300)).is_err());
    }

    #[test]
    fn gzip_round_trips_through_gzip_and_back() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let gz = gzip_stored(&data);
        assert_eq!(gunzip_stored(&gz).unwrap(), data);
        let d = tmp("gz");
        std::fs::write(d.join("x.gz"), &gz).unwrap();
        let out = Command::new("gzip")
            .arg("-dc")
            .arg(d.join("x.gz"))
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&d);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.stdout, data);
    }

    fn sample(reference: &str) -> Archive {
        let mut tree = Tree::default();
        tree.file("usr/bin/x", 0o755, b"bin".to_vec());
        let base = Layer::from_tar(&tree.to_tar().unwrap(), "base");
        let mut top = Tree::default();
        top.file("etc/y", 0o644, b"y".to_vec());
        let top = Layer::from_tar(&top.to_tar().unwrap(), "top");
        image_archive(&ImageSpec {
            reference,
            layers: vec![base, top],
            config: json!({"Entrypoint": ["/usr/bin/x"], "Cmd": ["run"], "Labels": {"a": "b"}}),
        })
        .unwrap()
    }

    #[test]
    fn archive_lists_the_layout_and_its_blobs_and_reads_back() {
        let a = sample("dranet.test/x:2");
        let d = tmp("arch");
        std::fs::write(d.join("a.tar"), &a.bytes).unwrap();
        let out = Command::new("tar")
            .arg("-tf")
            .arg(d.join("a.tar"))
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&d);
        let list = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success());
        assert!(list.contains("oci-layout"), "{list}");
        assert!(list.contains("index.json"), "{list}");
        // The directory and four blobs: config, manifest, two layers.
        assert_eq!(list.matches("blobs/sha256/").count(), 5, "{list}");
        let r = read_archive(&a.bytes).unwrap();
        assert_eq!(r.reference, "dranet.test/x:2");
        assert_eq!(r.manifest_digest, a.manifest_digest);
        assert_eq!(r.config["Cmd"][0], "run");
        assert_eq!(r.layers.len(), 2);
        assert_eq!(r.layers[1].created_by, "top");
        let top = read_tar(&gunzip_stored(&r.layers[1].blob).unwrap()).unwrap();
        assert_eq!(
            digest(&gunzip_stored(&r.layers[1].blob).unwrap()),
            r.layers[1].diff_id
        );
        assert!(top.iter().any(|e| e.name == "etc/y"));
    }

    #[test]
    fn the_same_input_gives_the_same_digest() {
        let a = sample("dranet.test/x:2");
        let b = sample("dranet.test/x:2");
        assert_eq!(a.bytes, b.bytes);
        assert_eq!(a.manifest_digest, b.manifest_digest);
        assert_ne!(sample("dranet.test/x:3").bytes, a.bytes);
    }

    #[test]
    fn a_tree_from_disk_is_sorted_mapped_and_independent_of_times() {
        let d = tmp("tree");
        std::fs::create_dir_all(d.join("lib/sub")).unwrap();
        std::fs::write(d.join("lib/sub/b"), b"b").unwrap();
        std::fs::write(d.join("lib/a"), b"a").unwrap();
        std::fs::create_dir_all(d.join("usr/share/doc/p")).unwrap();
        std::fs::write(d.join("usr/share/doc/p/README"), b"r").unwrap();
        std::os::unix::fs::symlink("a", d.join("lib/l")).unwrap();
        let map = |p: &str| {
            if p.starts_with("usr/share/doc/") && !p.ends_with("p") {
                None
            } else {
                Some(p.replacen("lib", "usr/lib", 1))
            }
        };
        let mut t1 = Tree::default();
        t1.add_dir(&d, &map).unwrap();
        // A new mtime changes nothing.
        std::fs::write(d.join("lib/a"), b"a").unwrap();
        let mut t2 = Tree::default();
        t2.add_dir(&d, &map).unwrap();
        let _ = std::fs::remove_dir_all(&d);
        let (a, b) = (t1.to_tar().unwrap(), t2.to_tar().unwrap());
        assert_eq!(a, b);
        let names: Vec<String> = read_tar(&a).unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(
            names,
            [
                "usr/",
                "usr/lib/",
                "usr/lib/a",
                "usr/lib/l",
                "usr/lib/sub/",
                "usr/lib/sub/b",
                "usr/share/",
                "usr/share/doc/",
                "usr/share/doc/p/"
            ]
        );
    }
}
