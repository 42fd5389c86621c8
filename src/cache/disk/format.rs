//! The object file format and the directory layout.
//!
//! One file per object, little-endian:
//!
//! ```text
//! header   "PORTICO2" (8 bytes) | meta_len: u32
//! meta     StoredMeta::encode() (meta_len bytes)
//! body     body_len bytes
//! trailer  body_len: u64 | expires: u64 | checksum: u64 | "PORTEND1" (8 bytes)
//! ```
//!
//! `checksum` is xxh3-64 over the meta bytes, the body bytes, then the
//! trailer's `body_len` and `expires` fields (16 bytes), computed
//! incrementally as the object is written. `expires` is the caller's expiry
//! hint (unix seconds, 0 = unknown) so the garbage collector still knows
//! which objects are expired after a restart. A file is valid only if its
//! size is exactly `12 + meta_len + body_len + 32`, both magics match and
//! the meta decodes; the body checksum is verified when the body is read.
//!
//! Objects live at `<dir>/<L1>/<L2>/<32 hex digits>` with `L1 = id mod
//! levels[0]` and `L2 = (id / levels[0]) mod levels[1]`, each directory name
//! two lower-case hex digits (three when the level has more than 256
//! directories). New objects are written under `<dir>/tmp/` and renamed
//! into place.
//!
//! Version 2 (`PORTICO2`) changed no byte of the layout, only what keys
//! mean: a reverse-proxied object's key names its upstream group
//! (`crate::cache::key`). A version 1 file may hold a key a reverse client
//! chose to look like a forward-proxy URL, so it is invalid (removed when
//! found, like a corrupt one) rather than read as if it were trustworthy.

use crate::cache::key::ObjectId;
use std::fs::File;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

/// First bytes of every object file.
pub const HEADER_MAGIC: &[u8; 8] = b"PORTICO2";
/// The first bytes of a version 1 object file, whose key is not trusted.
const OLD_MAGIC: &[u8; 8] = b"PORTICO1";
/// Last bytes of every complete object file.
pub const TRAILER_MAGIC: &[u8; 8] = b"PORTEND1";
/// Header size: magic + meta length.
pub const HEADER_LEN: u64 = 12;
/// Trailer size: body length, expires, checksum, magic.
pub const TRAILER_LEN: u64 = 32;
/// Larger metadata is treated as corruption.
pub const MAX_META_LEN: u32 = 16 << 20;
/// The temporary directory's name under the cache directory.
pub const TMP_DIR: &str = "tmp";

/// Encodes the header for `meta_len` bytes of metadata.
pub fn encode_header(meta_len: u32) -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(HEADER_MAGIC);
    h[8..].copy_from_slice(&meta_len.to_le_bytes());
    h
}

/// Decodes a header into the metadata length.
pub fn decode_header(h: &[u8]) -> Result<u32, Corrupt> {
    if h.len() >= HEADER_LEN as usize && &h[..8] == OLD_MAGIC {
        return Err(Corrupt(
            "object of an older cache format (its key may not name its upstream)",
        ));
    }
    if h.len() < HEADER_LEN as usize || &h[..8] != HEADER_MAGIC {
        return Err(Corrupt("bad header magic"));
    }
    let len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    if len > MAX_META_LEN {
        return Err(Corrupt("metadata too large"));
    }
    Ok(len)
}

/// The fixed-size end of an object file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trailer {
    /// Body length in bytes.
    pub body_len: u64,
    /// Expiry hint, unix seconds; 0 = unknown.
    pub expires: u64,
    /// xxh3-64 of meta, body, body_len and expires.
    pub checksum: u64,
}

impl Trailer {
    /// The byte form.
    pub fn encode(&self) -> [u8; TRAILER_LEN as usize] {
        let mut t = [0u8; TRAILER_LEN as usize];
        t[..8].copy_from_slice(&self.body_len.to_le_bytes());
        t[8..16].copy_from_slice(&self.expires.to_le_bytes());
        t[16..24].copy_from_slice(&self.checksum.to_le_bytes());
        t[24..].copy_from_slice(TRAILER_MAGIC);
        t
    }

    /// Parses what `encode` wrote.
    pub fn decode(t: &[u8]) -> Result<Trailer, Corrupt> {
        if t.len() != TRAILER_LEN as usize || &t[24..] != TRAILER_MAGIC {
            return Err(Corrupt("bad trailer magic"));
        }
        let u = |i: usize| u64::from_le_bytes(t[i..i + 8].try_into().unwrap_or([0; 8]));
        Ok(Trailer {
            body_len: u(0),
            expires: u(8),
            checksum: u(16),
        })
    }
}

/// The incremental checksum of an object.
pub struct Checksum(Xxh3);

impl Checksum {
    /// Starts with the metadata bytes.
    pub fn new(meta: &[u8]) -> Checksum {
        let mut h = Xxh3::new();
        h.update(meta);
        Checksum(h)
    }

    /// Adds body bytes.
    pub fn update(&mut self, body: &[u8]) {
        self.0.update(body);
    }

    /// Adds the trailer fields and returns the checksum.
    pub fn finish(mut self, body_len: u64, expires: u64) -> u64 {
        self.0.update(&body_len.to_le_bytes());
        self.0.update(&expires.to_le_bytes());
        self.0.digest()
    }
}

/// Why a file is not a valid object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Corrupt(pub &'static str);

impl std::fmt::Display for Corrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Reading an object's envelope failed.
#[derive(Debug)]
pub enum ReadError {
    /// The file could not be read (NotFound: it vanished).
    Io(io::Error),
    /// The file is not a valid object; it should be removed.
    Corrupt(Corrupt),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ReadError::Corrupt(Corrupt("truncated"))
        } else {
            ReadError::Io(e)
        }
    }
}

impl From<Corrupt> for ReadError {
    fn from(c: Corrupt) -> Self {
        ReadError::Corrupt(c)
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Corrupt(c) => write!(f, "corrupt: {c}"),
        }
    }
}

/// An object file's header, metadata and trailer, and what `fstat` said.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// The raw metadata bytes (decode with `StoredMeta::decode`).
    pub meta: bytes::Bytes,
    /// The trailer.
    pub trailer: Trailer,
    /// File size.
    pub file_len: u64,
    /// Modification time, unix seconds (when it was written).
    pub mtime: i64,
    /// Access time, unix seconds (coarse: relatime).
    pub atime: i64,
    /// Device and inode: which file this was, to remove only that one.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
}

impl Envelope {
    /// Where the body starts in the file.
    pub fn body_offset(&self) -> u64 {
        HEADER_LEN + self.meta.len() as u64
    }
}

/// Reads and checks an object file's envelope (header, meta, trailer and
/// the size equation) with one read for small objects. The body and the
/// checksum are not read.
pub fn read_envelope(file: &File) -> Result<Envelope, ReadError> {
    read_envelope_with(file, &read_exact_at)
}

/// Reads exactly `buf.len()` bytes of a file at an offset.
pub type ReadExactAt<'a> = &'a dyn Fn(&File, &mut [u8], u64) -> std::io::Result<()>;

/// The [`ReadExactAt`] that waits for the disk: `FileExt::read_exact_at`.
pub fn read_exact_at(file: &File, buf: &mut [u8], off: u64) -> std::io::Result<()> {
    file.read_exact_at(buf, off)
}

/// [`read_envelope`] with the file's bytes read by `read_exact_at` (one
/// that fails with `WouldBlock` rather than wait for the disk, say).
pub fn read_envelope_with(file: &File, read_exact_at: ReadExactAt<'_>) -> Result<Envelope, ReadError> {
    let st = file.metadata()?;
    let len = st.len();
    if len < HEADER_LEN + TRAILER_LEN {
        return Err(Corrupt("shorter than header and trailer").into());
    }
    // On the stack, not from the allocator: no malloc and free for every
    // disk-tier hit without a held file.
    let mut first = [0u8; 4096];
    let buf = &mut first[..len.min(4096) as usize];
    read_exact_at(file, buf, 0)?;
    let buf = &*buf;
    let meta_len = decode_header(buf)? as u64;
    let meta_end = HEADER_LEN + meta_len;
    if meta_end + TRAILER_LEN > len {
        return Err(Corrupt("metadata runs past the end").into());
    }
    let meta = if meta_end as usize <= buf.len() {
        bytes::Bytes::copy_from_slice(&buf[HEADER_LEN as usize..meta_end as usize])
    } else {
        let mut m = vec![0u8; meta_len as usize];
        read_exact_at(file, &mut m, HEADER_LEN)?;
        m.into()
    };
    let tstart = len - TRAILER_LEN;
    let trailer = if len as usize <= buf.len() {
        Trailer::decode(&buf[tstart as usize..])?
    } else {
        let mut t = [0u8; TRAILER_LEN as usize];
        read_exact_at(file, &mut t, tstart)?;
        Trailer::decode(&t)?
    };
    if meta_end
        .checked_add(trailer.body_len)
        .and_then(|n| n.checked_add(TRAILER_LEN))
        != Some(len)
    {
        return Err(Corrupt("size does not match the trailer").into());
    }
    Ok(Envelope {
        meta,
        trailer,
        file_len: len,
        mtime: st.mtime(),
        atime: st.atime(),
        dev: st.dev(),
        ino: st.ino(),
    })
}

/// Reads the whole body and compares the checksum; returns the body length.
/// `on_bytes` is told how many bytes were read after each chunk.
pub fn verify_body(file: &File, env: &Envelope, on_bytes: &mut dyn FnMut(u64)) -> Result<u64, ReadError> {
    let mut sum = Checksum::new(&env.meta);
    let mut buf = vec![0u8; 256 << 10];
    let mut off = env.body_offset();
    let mut left = env.trailer.body_len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..n], off)?;
        sum.update(&buf[..n]);
        off += n as u64;
        left -= n as u64;
        on_bytes(n as u64);
    }
    if sum.finish(env.trailer.body_len, env.trailer.expires) != env.trailer.checksum {
        return Err(Corrupt("checksum mismatch").into());
    }
    Ok(env.trailer.body_len)
}

/// Where objects go: the cache directory and its two directory levels.
#[derive(Debug, Clone)]
pub struct Layout {
    root: PathBuf,
    levels: [u16; 2],
}

/// Appends a level directory's name: `%02x` up to 256 directories,
/// `%03x` above.
fn push_level_name(out: &mut Vec<u8>, n: u32, count: u16) {
    push_hex(out, u128::from(n), if count <= 256 { 2 } else { 3 });
}

/// Appends the low `digits` hex digits of `n`, lower-case, zero-padded
/// (as `{:0digits$x}` for values that fit).
fn push_hex(out: &mut Vec<u8>, n: u128, digits: u32) {
    for i in (0..digits).rev() {
        out.push(b"0123456789abcdef"[((n >> (4 * i)) & 0xf) as usize]);
    }
}

/// Parses a level directory name (2 or 3 lower-case hex digits).
pub fn parse_level_name(name: &str) -> Option<u32> {
    let ok =
        (name.len() == 2 || name.len() == 3) && name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    ok.then(|| u32::from_str_radix(name, 16).ok()).flatten()
}

impl Layout {
    /// A layout; a level of 0 directories is taken as 1.
    pub fn new(root: &Path, levels: [u16; 2]) -> Layout {
        Layout {
            root: root.to_path_buf(),
            levels: [levels[0].max(1), levels[1].max(1)],
        }
    }

    /// The cache directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory counts.
    pub fn levels(&self) -> [u16; 2] {
        self.levels
    }

    /// The temporary directory.
    pub fn tmp_dir(&self) -> PathBuf {
        self.root.join(TMP_DIR)
    }

    /// The level indices of an object.
    pub fn slots(&self, id: ObjectId) -> (u32, u32) {
        let l0 = self.levels[0] as u128;
        let l1 = self.levels[1] as u128;
        ((id.0 % l0) as u32, ((id.0 / l0) % l1) as u32)
    }

    /// The directory holding an object.
    pub fn dir_of(&self, id: ObjectId) -> PathBuf {
        PathBuf::from(std::ffi::OsString::from_vec(self.dir_bytes(id)))
    }

    /// The final path of an object: `dir_of(id)` joined with `id.hex()`,
    /// built in one allocation (every disk-tier hit without a held file
    /// asks for it; three `format!`s and two joins were about 2,400
    /// instructions of it).
    pub fn path_of(&self, id: ObjectId) -> PathBuf {
        let mut path = self.dir_bytes(id);
        path.push(b'/');
        push_hex(&mut path, id.0, 32);
        PathBuf::from(std::ffi::OsString::from_vec(path))
    }

    /// `dir_of`'s bytes, with room for the object's name after them.
    fn dir_bytes(&self, id: ObjectId) -> Vec<u8> {
        let (a, b) = self.slots(id);
        let root = self.root.as_os_str().as_bytes();
        let mut path = Vec::with_capacity(root.len() + 1 + 3 + 1 + 3 + 1 + 32);
        path.extend_from_slice(root);
        for (n, count) in [(a, self.levels[0]), (b, self.levels[1])] {
            // As `Path::join`: no separator after an empty root or a
            // trailing one.
            if path.last().is_some_and(|&c| c != b'/') {
                path.push(b'/');
            }
            push_level_name(&mut path, n, count);
        }
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn path_of_is_the_object_directory_joined_with_its_hex_name() {
        // id 0x1234 with 16 x 256 directories: 0x1234 % 16 = 4, then
        // (0x1234 / 16) % 256 = 0x23.
        let layout = Layout::new(Path::new("/c"), [16, 256]);
        assert_eq!(layout.dir_of(ObjectId(0x1234)), Path::new("/c/04/23"));
        assert_eq!(
            layout.path_of(ObjectId(0x1234)),
            Path::new("/c/04/23/00000000000000000000000000001234")
        );
        assert_eq!(
            Layout::new(Path::new("/c/"), [257, 16]).dir_of(ObjectId(256)),
            Path::new("/c/100/00")
        );
        let ids = [0, 1, 255, 256, 4095, 0xdead_beef, u128::MAX / 3, u128::MAX].map(ObjectId);
        for root in ["", "/", "/var/cache/portico", "/var/cache/portico/", "rel/dir"] {
            for levels in [[1, 1], [16, 256], [256, 256], [257, 4096], [4096, 16]] {
                let layout = Layout::new(Path::new(root), levels);
                for id in ids {
                    assert_eq!(
                        layout.path_of(id),
                        layout.dir_of(id).join(id.hex()),
                        "{root} {levels:?} {id:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn header_and_trailer_round_trip() {
        let h = encode_header(1234);
        assert_eq!(&h[..8], b"PORTICO2");
        assert_eq!(decode_header(&h), Ok(1234));
        assert!(decode_header(b"PORTICO3\0\0\0\0").is_err());
        // Version 1 objects are invalid (keys without their upstream group).
        let mut old = h;
        old[..8].copy_from_slice(b"PORTICO1");
        assert!(decode_header(&old).is_err());
        assert!(decode_header(&encode_header(MAX_META_LEN + 1)).is_err());
        let t = Trailer {
            body_len: 5,
            expires: 1_700_000_000,
            checksum: 0xdead_beef,
        };
        let b = t.encode();
        assert_eq!(&b[24..], b"PORTEND1");
        assert_eq!(Trailer::decode(&b), Ok(t));
        let mut bad = b;
        bad[31] ^= 1;
        assert!(Trailer::decode(&bad).is_err());
    }

    fn write_object(f: &mut File, meta: &[u8], body: &[u8], expires: u64) {
        let mut sum = Checksum::new(meta);
        sum.update(body);
        let t = Trailer {
            body_len: body.len() as u64,
            expires,
            checksum: sum.finish(body.len() as u64, expires),
        };
        f.write_all(&encode_header(meta.len() as u32)).unwrap();
        f.write_all(meta).unwrap();
        f.write_all(body).unwrap();
        f.write_all(&t.encode()).unwrap();
    }

    #[test]
    fn envelope_small_and_large() {
        let dir = tempfile::tempdir().unwrap();
        for (meta_len, body_len) in [(0usize, 0usize), (10, 1), (100, 5000), (5000, 10), (3000, 100_000)] {
            let meta = vec![7u8; meta_len];
            let body: Vec<u8> = (0..body_len).map(|i| i as u8).collect();
            let p = dir.path().join(format!("o{meta_len}-{body_len}"));
            let mut f = File::create(&p).unwrap();
            write_object(&mut f, &meta, &body, 42);
            drop(f);
            let f = File::open(&p).unwrap();
            let env = read_envelope(&f).unwrap();
            assert_eq!(env.meta, meta);
            assert_eq!(env.trailer.body_len, body_len as u64);
            assert_eq!(env.trailer.expires, 42);
            assert_eq!(env.file_len, (12 + meta_len + body_len + 32) as u64);
            assert_eq!(verify_body(&f, &env, &mut |_| {}).unwrap(), body_len as u64);
        }
    }

    #[test]
    fn envelope_rejects_truncation_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("o");
        let mut f = File::create(&p).unwrap();
        write_object(&mut f, b"meta", &[1u8; 10_000], 0);
        drop(f);
        let full = std::fs::read(&p).unwrap();
        for cut in [1usize, 5, 32, 10_000, full.len() - 1] {
            std::fs::write(&p, &full[..full.len() - cut]).unwrap();
            let f = File::open(&p).unwrap();
            assert!(matches!(read_envelope(&f), Err(ReadError::Corrupt(_))), "cut {cut}");
        }
        let mut flipped = full.clone();
        flipped[12 + 4 + 500] ^= 0x40;
        std::fs::write(&p, &flipped).unwrap();
        let f = File::open(&p).unwrap();
        let env = read_envelope(&f).unwrap();
        assert!(matches!(
            verify_body(&f, &env, &mut |_| {}),
            Err(ReadError::Corrupt(Corrupt("checksum mismatch")))
        ));
    }

    #[test]
    fn path_layout() {
        let l = Layout::new(Path::new("/c"), [16, 256]);
        let id = ObjectId(0x1234_5678_9abc_def0_1234_5678_9abc_def5);
        // L1 = id mod 16 = 5; L2 = (id / 16) mod 256 = 0xef.
        assert_eq!(l.slots(id), (5, 0xef));
        assert_eq!(l.path_of(id), PathBuf::from(format!("/c/05/ef/{}", id.hex())));
        let l = Layout::new(Path::new("/c"), [4096, 3]);
        assert_eq!(l.slots(ObjectId(4096 * 5 + 17)), (17, 2));
        assert_eq!(l.dir_of(ObjectId(4096 * 5 + 17)), PathBuf::from("/c/011/02"));
        assert_eq!(parse_level_name("0a"), Some(10));
        assert_eq!(parse_level_name("fff"), Some(4095));
        assert_eq!(parse_level_name("0A"), None);
        assert_eq!(parse_level_name("tmp"), None);
        assert_eq!(parse_level_name("1"), None);
    }
}
