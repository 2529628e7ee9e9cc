//! A small reader of kernel BTF (`/sys/kernel/btf/vmlinux`) that resolves struct member offsets
//! such as `net.ns.inum`, descending into anonymous structs and unions. aya-ebpf has no CO-RE, so
//! the loader writes these offsets into the programs' `CONFIG` before loading: nothing is
//! hard-coded, and field moves between kernel versions (6.1 / 6.12 / 6.18) are followed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a BTF blob: {reason}")]
    Malformed { reason: &'static str },
}

const BTF_MAGIC: u16 = 0xeb9f;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// One parsed type record: where its data starts in the type section.
#[derive(Clone, Copy)]
struct TypeRec {
    name_off: u32,
    info: u32,
    /// `size` or `type` (union in `struct btf_type`).
    size_or_type: u32,
    /// Byte offset of the kind-specific data following the 12-byte header.
    data: usize,
}

impl TypeRec {
    fn kind(&self) -> u32 {
        (self.info >> 24) & 0x1f
    }
    fn vlen(&self) -> usize {
        (self.info & 0xffff) as usize
    }
    fn kind_flag(&self) -> bool {
        self.info >> 31 == 1
    }
}

/// Parsed BTF: types by id, names by (kind, name).
pub struct Btf {
    types_sec: Vec<u8>,
    strings: Vec<u8>,
    /// Index = type id (0 = void, a placeholder).
    types: Vec<TypeRec>,
    /// Struct/union/func names → type ids.
    by_name: HashMap<(u32, String), u32>,
}

impl Btf {
    /// The running kernel's BTF.
    pub fn from_sys_fs() -> Result<Self, BtfError> {
        Self::from_file(Path::new("/sys/kernel/btf/vmlinux"))
    }

    /// Parses a BTF file.
    pub fn from_file(path: &Path) -> Result<Self, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&data)
    }

    /// Parses a raw BTF blob (little endian, as on x86_64).
    pub fn parse(data: &[u8]) -> Result<Self, BtfError> {
        let u16_at = |o: usize| data.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
        let u32_at = |o: usize| {
            data.get(o..o + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let bad = |reason| BtfError::Malformed { reason };
        if u16_at(0) != Some(BTF_MAGIC) {
            return Err(bad("bad magic"));
        }
        let hdr_len = u32_at(4).ok_or(bad("short header"))? as usize;
        let type_off = u32_at(8).ok_or(bad("short header"))? as usize;
        let type_len = u32_at(12).ok_or(bad("short header"))? as usize;
        let str_off = u32_at(16).ok_or(bad("short header"))? as usize;
        let str_len = u32_at(20).ok_or(bad("short header"))? as usize;
        let types_sec = data
            .get(hdr_len + type_off..hdr_len + type_off + type_len)
            .ok_or(bad("type section out of bounds"))?
            .to_vec();
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(bad("string section out of bounds"))?
            .to_vec();
        let mut btf = Self {
            types_sec,
            strings,
            types: vec![TypeRec {
                name_off: 0,
                info: 0,
                size_or_type: 0,
                data: 0,
            }],
            by_name: HashMap::new(),
        };
        btf.index()?;
        Ok(btf)
    }

    fn u32_at(&self, off: usize) -> Option<u32> {
        self.types_sec
            .get(off..off + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn name(&self, off: u32) -> &str {
        let start = off as usize;
        let Some(rest) = self.strings.get(start..) else {
            return "";
        };
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    fn index(&mut self) -> Result<(), BtfError> {
        let mut off = 0usize;
        let len = self.types_sec.len();
        while off + 12 <= len {
            let (Some(name_off), Some(info), Some(size_or_type)) =
                (self.u32_at(off), self.u32_at(off + 4), self.u32_at(off + 8))
            else {
                return Err(BtfError::Malformed {
                    reason: "truncated type",
                });
            };
            let rec = TypeRec {
                name_off,
                info,
                size_or_type,
                data: off + 12,
            };
            let extra = match rec.kind() {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * rec.vlen(),
                KIND_ENUM | KIND_FUNC_PROTO => 8 * rec.vlen(),
                KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
                | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => 0,
                _ => {
                    return Err(BtfError::Malformed {
                        reason: "unknown type kind",
                    });
                }
            };
            let id = u32::try_from(self.types.len()).map_err(|_| BtfError::Malformed {
                reason: "too many types",
            })?;
            let k = rec.kind();
            if matches!(k, KIND_STRUCT | KIND_UNION | KIND_FUNC) && rec.name_off != 0 {
                let name = self.name(rec.name_off).to_owned();
                // Keep the first definition (module BTF may repeat names; vmlinux does not).
                self.by_name.entry((k, name)).or_insert(id);
            }
            self.types.push(rec);
            off = rec.data + extra;
        }
        Ok(())
    }

    /// Does the kernel have a (non-inlined) function of this name?
    #[must_use]
    pub fn has_function(&self, name: &str) -> bool {
        self.by_name.contains_key(&(KIND_FUNC, name.to_owned()))
    }

    /// Skips typedef/const/volatile/restrict/type-tag wrappers.
    fn resolve(&self, mut id: u32) -> Option<TypeRec> {
        for _ in 0..32 {
            let rec = *self.types.get(id as usize)?;
            match rec.kind() {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = rec.size_or_type
                }
                _ => return Some(rec),
            }
        }
        None
    }

    /// Byte offset of `member` inside a struct/union record, searching anonymous members;
    /// returns the offset and the member's type id.
    fn member(&self, rec: TypeRec, member: &str, depth: u32) -> Option<(u32, u32)> {
        if depth > 8 || !matches!(rec.kind(), KIND_STRUCT | KIND_UNION) {
            return None;
        }
        for i in 0..rec.vlen() {
            let m = rec.data + 12 * i;
            let (name_off, ty, raw_off) = (self.u32_at(m)?, self.u32_at(m + 4)?, self.u32_at(m + 8)?);
            let bit_off = if rec.kind_flag() {
                raw_off & 0x00ff_ffff
            } else {
                raw_off
            };
            if name_off == 0 {
                let inner = self.resolve(ty)?;
                if let Some((off, t)) = self.member(inner, member, depth + 1) {
                    return Some((bit_off / 8 + off, t));
                }
            } else if self.name(name_off) == member {
                return Some((bit_off / 8, ty));
            }
        }
        None
    }

    /// Offset of a dotted member path, e.g. `offset("net", "ns.inum")`.
    #[must_use]
    pub fn offset(&self, struct_name: &str, path: &str) -> Option<u32> {
        let id = *self.by_name.get(&(KIND_STRUCT, struct_name.to_owned()))?;
        let mut rec = self.resolve(id)?;
        let mut total = 0u32;
        let mut parts = path.split('.').peekable();
        while let Some(part) = parts.next() {
            let (off, ty) = self.member(rec, part, 0)?;
            total += off;
            if parts.peek().is_some() {
                rec = self.resolve(ty)?;
            }
        }
        Some(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Builds a tiny BTF blob: `struct inner { int a; int b; }`,
    /// `struct outer { long x; union { struct inner in; }; int y; }`, `func f`.
    fn blob() -> Vec<u8> {
        let mut strs = b"\0int\0inner\0a\0b\0outer\0x\0in\0y\0f\0".to_vec();
        let s = |name: &str, strs: &[u8]| -> u32 {
            let needle = [name.as_bytes(), b"\0"].concat();
            strs.windows(needle.len())
                .enumerate()
                .find(|(i, w)| *w == needle.as_slice() && strs[i - 1] == 0)
                .map(|(i, _)| i as u32)
                .unwrap()
        };
        let mut t = Vec::new();
        let mut push = |v: u32| t.extend_from_slice(&v.to_le_bytes());
        // 1: int (size 4)
        push(s("int", &strs));
        push(KIND_INT << 24);
        push(4);
        push(32);
        // 2: struct inner { int a@0; int b@32 }
        push(s("inner", &strs));
        push((KIND_STRUCT << 24) | 2);
        push(8);
        push(s("a", &strs));
        push(1);
        push(0);
        push(s("b", &strs));
        push(1);
        push(32);
        // 3: anonymous union { struct inner in@0 }
        push(0);
        push((KIND_UNION << 24) | 1);
        push(8);
        push(s("in", &strs));
        push(2);
        push(0);
        // 4: struct outer { int x@0; <anon union>@64; int y@128 }
        push(s("outer", &strs));
        push((KIND_STRUCT << 24) | 3);
        push(20);
        push(s("x", &strs));
        push(1);
        push(0);
        push(0);
        push(3);
        push(64);
        push(s("y", &strs));
        push(1);
        push(128);
        // 5: func f
        push(s("f", &strs));
        push(KIND_FUNC << 24);
        push(0);
        strs.push(0);
        let mut out = Vec::new();
        out.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        out.push(1);
        out.push(0);
        out.extend_from_slice(&24u32.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(t.len() as u32).to_le_bytes());
        out.extend_from_slice(&(t.len() as u32).to_le_bytes());
        out.extend_from_slice(&(strs.len() as u32).to_le_bytes());
        out.extend_from_slice(&t);
        out.extend_from_slice(&strs);
        out
    }

    #[test]
    fn resolves_nested_and_anonymous_members() {
        let btf = Btf::parse(&blob()).unwrap();
        assert_eq!(btf.offset("outer", "x"), Some(0));
        assert_eq!(btf.offset("outer", "in"), Some(8));
        assert_eq!(btf.offset("outer", "in.b"), Some(12));
        assert_eq!(btf.offset("outer", "y"), Some(16));
        assert_eq!(btf.offset("outer", "nope"), None);
        assert_eq!(btf.offset("missing", "x"), None);
        assert!(btf.has_function("f"));
        assert!(!btf.has_function("g"));
    }

    #[test]
    fn rejects_garbage() {
        assert!(Btf::parse(b"garbage").is_err());
        let mut b = blob();
        b.truncate(30);
        assert!(Btf::parse(&b).is_err());
    }

    /// On the running kernel: offsets exist and match the layout the notes measured on 6.18
    /// only where the kernel is that one; everywhere they must at least resolve.
    #[test]
    fn running_kernel_offsets_resolve() {
        let Ok(btf) = Btf::from_sys_fs() else {
            assert!(
                std::env::var("CI").is_err(),
                "CI: /sys/kernel/btf/vmlinux must be readable"
            );
            eprintln!("skipping: no kernel BTF");
            return;
        };
        for (s, m) in [
            ("net", "ns.inum"),
            ("net", "net_cookie"),
            ("net_device", "ifindex"),
            ("net_device", "name"),
            ("net_device", "nd_net"),
            ("work_struct", "func"),
            ("vfsmount", "mnt_sb"),
            ("super_block", "s_magic"),
            ("inode", "i_ino"),
        ] {
            assert!(btf.offset(s, m).is_some(), "{s}.{m} not found");
        }
        assert!(btf.has_function("__put_net"));
    }
}
