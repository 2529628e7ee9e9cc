//! The part of HPACK (RFC 7541) that [`super`] needs: a decoder that tracks the client's dynamic
//! table, and an encoder that never touches the server's (every field is written as an index
//! into the static table or as a literal without indexing, strings not Huffman-coded).
//!
//! Everything is bounded: integers above 2^28, a table size update above the decoder's limit and
//! a decoded list above the caller's limit are errors; nothing panics on any input.

use std::collections::VecDeque;

use bytes::Bytes;

/// Decoding errors; each is a connection error (`COMPRESSION_ERROR`) for HTTP/2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("HPACK: header block ends inside a field")]
    Truncated,
    #[error("HPACK: integer over 2^28")]
    IntegerOverflow,
    #[error("HPACK: index {0} is in neither table")]
    BadIndex(usize),
    #[error("HPACK: invalid Huffman code")]
    Huffman,
    #[error("HPACK: dynamic table size update to {size}, over the limit of {limit}")]
    TableSizeOverLimit { size: usize, limit: usize },
    #[error("HPACK: dynamic table size update after a header field")]
    LateTableSizeUpdate,
    #[error("HPACK: decoded header list over {limit} bytes")]
    ListTooLarge { limit: usize },
}

/// One decoded field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: Bytes,
    pub value: Bytes,
    /// Sent as "never indexed" (RFC 7541 §6.2.3): kept so on re-encoding.
    pub never_indexed: bool,
}

impl Field {
    /// Size in the sense of RFC 7541 §4.1 (the 32 bytes of overhead included).
    fn size(&self) -> usize {
        entry_size(&self.name, &self.value)
    }
}

fn entry_size(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + 32
}

/// RFC 7541 Appendix A.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// Bit length of each symbol's Huffman code (RFC 7541 Appendix B; symbol 256 is EOS). The code
/// is canonical (codes of one length are consecutive, in symbol order, and shorter codes sort
/// first), so the lengths alone define it: see [`CANON`].
const HUFFMAN_BITS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, //
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, //
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, //
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, //
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, //
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, //
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, //
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, //
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, //
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, //
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, //
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, //
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, //
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, //
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, //
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, //
    30,
];

const EOS: u16 = 256;
const MAX_CODE_BITS: usize = 30;

/// The canonical Huffman code, per length: the first code, how many codes, and where their
/// symbols start in `symbols` (sorted by length, then symbol).
struct Canon {
    first: [u32; MAX_CODE_BITS + 1],
    count: [u32; MAX_CODE_BITS + 1],
    offset: [usize; MAX_CODE_BITS + 1],
    symbols: [u16; 257],
}

const fn canon() -> Canon {
    let mut count = [0u32; MAX_CODE_BITS + 1];
    let mut i = 0;
    while i < 257 {
        count[HUFFMAN_BITS[i] as usize] += 1;
        i += 1;
    }
    let mut offset = [0usize; MAX_CODE_BITS + 1];
    let mut first = [0u32; MAX_CODE_BITS + 1];
    let mut code = 0u32;
    let mut l = 1;
    while l <= MAX_CODE_BITS {
        offset[l] = offset[l - 1] + count[l - 1] as usize;
        first[l] = code;
        code = (code + count[l]) << 1;
        l += 1;
    }
    let mut next = offset;
    let mut symbols = [0u16; 257];
    i = 0;
    while i < 257 {
        let l = HUFFMAN_BITS[i] as usize;
        symbols[next[l]] = i as u16;
        next[l] += 1;
        i += 1;
    }
    Canon {
        first,
        count,
        offset,
        symbols,
    }
}

static CANON: Canon = canon();

/// Decodes a Huffman-coded string: at most 7 bits of padding, all ones (a prefix of EOS), and no
/// EOS symbol (RFC 7541 §5.2).
fn huffman_decode(src: &[u8]) -> Result<Vec<u8>, HpackError> {
    let c = &CANON;
    // The shortest code has 5 bits.
    let mut out = Vec::with_capacity(src.len() * 8 / 5);
    let (mut code, mut len) = (0u32, 0usize);
    for &byte in src {
        for bit in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> bit) & 1);
            len += 1;
            if len > MAX_CODE_BITS {
                return Err(HpackError::Huffman);
            }
            let n = code.wrapping_sub(c.first[len]);
            if code >= c.first[len] && n < c.count[len] {
                let sym = c.symbols[c.offset[len] + n as usize];
                if sym == EOS {
                    return Err(HpackError::Huffman);
                }
                out.push(sym as u8);
                code = 0;
                len = 0;
            }
        }
    }
    if len > 7 || code != (1u32 << len) - 1 {
        return Err(HpackError::Huffman);
    }
    Ok(out)
}

/// Reads an integer with an `n`-bit prefix (RFC 7541 §5.1) at `*pos`.
fn read_int(src: &[u8], pos: &mut usize, n: u32) -> Result<usize, HpackError> {
    let mask = (1usize << n) - 1;
    let first = *src.get(*pos).ok_or(HpackError::Truncated)?;
    *pos += 1;
    let mut v = usize::from(first) & mask;
    if v < mask {
        return Ok(v);
    }
    let mut shift = 0u32;
    loop {
        let b = *src.get(*pos).ok_or(HpackError::Truncated)?;
        *pos += 1;
        v += usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return if v > 1 << 28 {
                Err(HpackError::IntegerOverflow)
            } else {
                Ok(v)
            };
        }
        shift += 7;
        if shift > 21 {
            return Err(HpackError::IntegerOverflow);
        }
    }
}

fn read_string(src: &[u8], pos: &mut usize) -> Result<Bytes, HpackError> {
    let huffman = src.get(*pos).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let len = read_int(src, pos, 7)?;
    let end = pos.checked_add(len).ok_or(HpackError::Truncated)?;
    let raw = src.get(*pos..end).ok_or(HpackError::Truncated)?;
    *pos = end;
    Ok(if huffman {
        Bytes::from(huffman_decode(raw)?)
    } else {
        Bytes::copy_from_slice(raw)
    })
}

/// The decoding context of one direction of one connection.
#[derive(Debug)]
pub struct Decoder {
    table: VecDeque<(Bytes, Bytes)>,
    size: usize,
    max_size: usize,
    limit: usize,
}

impl Decoder {
    /// A table of 4096 bytes (the HTTP/2 default), which size updates may set up to `limit`.
    pub fn new(limit: usize) -> Self {
        Self {
            table: VecDeque::new(),
            size: 0,
            max_size: 4096.min(limit),
            limit,
        }
    }

    fn get(&self, index: usize) -> Result<(Bytes, Bytes), HpackError> {
        match index {
            0 => Err(HpackError::BadIndex(0)),
            1..=61 => {
                let (n, v) = STATIC[index - 1];
                Ok((Bytes::from_static(n.as_bytes()), Bytes::from_static(v.as_bytes())))
            }
            _ => self
                .table
                .get(index - 62)
                .cloned()
                .ok_or(HpackError::BadIndex(index)),
        }
    }

    fn evict_to(&mut self, room: usize) {
        while self.size > room {
            match self.table.pop_back() {
                Some((n, v)) => self.size -= entry_size(&n, &v),
                None => break,
            }
        }
    }

    fn insert(&mut self, name: Bytes, value: Bytes) {
        let s = entry_size(&name, &value);
        if s > self.max_size {
            // RFC 7541 §4.4: an entry larger than the table empties it.
            self.table.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max_size - s);
        self.size += s;
        self.table.push_front((name, value));
    }

    /// Decodes one complete header block; the list may be at most `max_list` bytes (RFC 7541
    /// sizes). On error the context is lost: the connection must end.
    pub fn decode(&mut self, block: &[u8], max_list: usize) -> Result<Vec<Field>, HpackError> {
        let mut fields = Vec::new();
        let (mut pos, mut list) = (0usize, 0usize);
        while let Some(&b) = block.get(pos) {
            let field = if b & 0x80 != 0 {
                let (name, value) = self.get(read_int(block, &mut pos, 7)?)?;
                Field {
                    name,
                    value,
                    never_indexed: false,
                }
            } else if b & 0xe0 == 0x20 {
                if !fields.is_empty() {
                    return Err(HpackError::LateTableSizeUpdate);
                }
                let size = read_int(block, &mut pos, 5)?;
                if size > self.limit {
                    return Err(HpackError::TableSizeOverLimit {
                        size,
                        limit: self.limit,
                    });
                }
                self.max_size = size;
                self.evict_to(size);
                continue;
            } else {
                let (prefix, indexed) = if b & 0xc0 == 0x40 { (6, true) } else { (4, false) };
                let name = match read_int(block, &mut pos, prefix)? {
                    0 => read_string(block, &mut pos)?,
                    i => self.get(i)?.0,
                };
                let value = read_string(block, &mut pos)?;
                if indexed {
                    self.insert(name.clone(), value.clone());
                }
                Field {
                    name,
                    value,
                    never_indexed: !indexed && b & 0x10 != 0,
                }
            };
            list += field.size();
            if list > max_list {
                return Err(HpackError::ListTooLarge { limit: max_list });
            }
            fields.push(field);
        }
        Ok(fields)
    }
}

fn write_int(out: &mut Vec<u8>, flags: u8, n: u32, mut v: usize) {
    let mask = (1usize << n) - 1;
    if v < mask {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | mask as u8);
    v -= mask;
    while v >= 0x80 {
        out.push(0x80 | (v & 0x7f) as u8);
        v >>= 7;
    }
    out.push(v as u8);
}

fn write_string(out: &mut Vec<u8>, s: &[u8]) {
    write_int(out, 0, 7, s.len());
    out.extend_from_slice(s);
}

/// Encodes `fields` without the dynamic table: a static entry that matches name and value is
/// indexed, a static name is referenced, everything else is a literal; "never indexed" stays so.
pub fn encode(fields: &[Field], out: &mut Vec<u8>) {
    for f in fields {
        let full = STATIC
            .iter()
            .position(|(n, v)| n.as_bytes() == f.name && v.as_bytes() == f.value);
        if let (Some(i), false) = (full, f.never_indexed) {
            write_int(out, 0x80, 7, i + 1);
            continue;
        }
        let flags = if f.never_indexed { 0x10 } else { 0x00 };
        match STATIC.iter().position(|(n, _)| n.as_bytes() == f.name) {
            Some(i) => write_int(out, flags, 4, i + 1),
            None => {
                write_int(out, flags, 4, 0);
                write_string(out, &f.name);
            }
        }
        write_string(out, &f.value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn pairs(fields: &[Field]) -> Vec<(String, String)> {
        fields
            .iter()
            .map(|f| {
                (
                    String::from_utf8_lossy(&f.name).into_owned(),
                    String::from_utf8_lossy(&f.value).into_owned(),
                )
            })
            .collect()
    }

    fn p(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn the_lengths_make_a_complete_prefix_code() {
        // Kraft: sum 2^-len == 1 for a complete code.
        let sum: u64 = HUFFMAN_BITS.iter().map(|&l| 1u64 << (30 - u32::from(l))).sum();
        assert_eq!(sum, 1 << 30);
        // EOS is the 30-bit all-ones code.
        let l = 30;
        assert_eq!(CANON.first[l] + CANON.count[l] - 1, (1 << 30) - 1);
        assert_eq!(CANON.symbols[CANON.offset[l] + CANON.count[l] as usize - 1], EOS);
    }

    /// RFC 7541 C.4: three requests with Huffman coding, sharing a dynamic table.
    #[test]
    fn rfc_7541_c4_requests_with_huffman() {
        let mut d = Decoder::new(4096);
        let r1 = d
            .decode(&unhex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"), 1 << 16)
            .unwrap();
        assert_eq!(
            pairs(&r1),
            p(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com")
            ])
        );
        let r2 = d
            .decode(&unhex("8286 84be 5886 a8eb 1064 9cbf"), 1 << 16)
            .unwrap();
        assert_eq!(
            pairs(&r2),
            p(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache")
            ])
        );
        let r3 = d
            .decode(
                &unhex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
                1 << 16,
            )
            .unwrap();
        assert_eq!(
            pairs(&r3),
            p(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value")
            ])
        );
        assert_eq!(d.size, 164);
    }

    /// RFC 7541 C.5: responses with a 256-byte table, so entries are evicted.
    #[test]
    fn rfc_7541_c5_eviction() {
        let mut d = Decoder::new(4096);
        // A size update to 256 first.
        let mut b1 = vec![0x3f, 0xe1, 0x01];
        b1.extend(unhex(
            "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133
             2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70
             6c65 2e63 6f6d",
        ));
        d.decode(&b1, 1 << 16).unwrap();
        assert_eq!(d.max_size, 256);
        assert_eq!(d.size, 222);
        let r2 = d.decode(&unhex("4803 3330 37c1 c0bf"), 1 << 16).unwrap();
        assert_eq!(r2[0].value, "307");
        assert_eq!(r2[1].value, "private");
        assert_eq!(r2[3].value, "https://www.example.com");
        assert_eq!(d.size, 222);
        assert_eq!(d.table.len(), 4);
    }

    #[test]
    fn malformed_blocks_are_errors_not_panics() {
        let mut d = Decoder::new(4096);
        assert_eq!(d.decode(&[0x80], 1 << 16), Err(HpackError::BadIndex(0)));
        assert_eq!(d.decode(&[0xbe], 1 << 16), Err(HpackError::BadIndex(62)));
        assert_eq!(d.decode(&[0x41, 0x05, b'a'], 1 << 16), Err(HpackError::Truncated));
        assert_eq!(
            d.decode(&[0xff, 0xff, 0xff, 0xff, 0xff], 1 << 16),
            Err(HpackError::IntegerOverflow)
        );
        // Huffman: the EOS pattern (30 ones) and padding longer than 7 bits.
        assert_eq!(
            d.decode(&[0x41, 0x84, 0xff, 0xff, 0xff, 0xff], 1 << 16),
            Err(HpackError::Huffman)
        );
        assert_eq!(
            d.decode(&[0x41, 0x82, 0x1f, 0xff], 1 << 16),
            Err(HpackError::Huffman)
        );
        // Padding that is not all ones: 'a' (00011) then 000.
        assert_eq!(d.decode(&[0x41, 0x81, 0x18], 1 << 16), Err(HpackError::Huffman));
        assert_eq!(
            d.decode(&[0x3f, 0xe2, 0x1f], 1 << 16),
            Err(HpackError::TableSizeOverLimit {
                size: 4097,
                limit: 4096
            })
        );
        assert_eq!(d.decode(&[0x3f, 0xe1, 0x1f], 1 << 16), Ok(vec![]));
        assert_eq!(
            d.decode(&[0x82, 0x20], 1 << 16),
            Err(HpackError::LateTableSizeUpdate)
        );
        for n in 0..=255u8 {
            for m in 0..=255u8 {
                let _ = Decoder::new(4096).decode(&[n, m, n, m], 1 << 16);
            }
        }
    }

    #[test]
    fn encoding_round_trips_without_touching_the_table() {
        let fields = vec![
            Field {
                name: Bytes::from_static(b":method"),
                value: Bytes::from_static(b"POST"),
                never_indexed: false,
            },
            Field {
                name: Bytes::from_static(b":authority"),
                value: Bytes::from_static(b"localhost"),
                never_indexed: false,
            },
            Field {
                name: Bytes::from_static(b"authorization"),
                value: Bytes::from_static(b"secret"),
                never_indexed: true,
            },
            Field {
                name: Bytes::from_static(b"x-long"),
                value: Bytes::from(vec![b'v'; 300]),
                never_indexed: false,
            },
        ];
        let mut out = Vec::new();
        encode(&fields, &mut out);
        assert_eq!(&out[..3], &[0x83, 0x01, 9]);
        let mut d = Decoder::new(4096);
        assert_eq!(d.decode(&out, 1 << 16).unwrap(), fields);
        assert!(d.table.is_empty());
    }

    #[test]
    fn the_list_size_is_bounded() {
        let mut d = Decoder::new(4096);
        // ":method GET" is 7 + 3 + 32 = 42 bytes; 100 of them are 4200.
        assert_eq!(
            d.decode(&[0x82; 100], 4199),
            Err(HpackError::ListTooLarge { limit: 4199 })
        );
        assert_eq!(d.decode(&[0x82; 100], 4200).unwrap().len(), 100);
    }
}
