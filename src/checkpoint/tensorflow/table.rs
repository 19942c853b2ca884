//! The LevelDB-format table ("SSTable") a TensorFlow V2 checkpoint's
//! `.index` is, as `tensorflow/core/lib/io/table_builder.cc`,
//! `block_builder.cc` and `format.cc` write it, uncompressed:
//!
//! - data blocks: entries `varint shared, varint unshared, varint value
//!   length, key suffix, value`, a restart point every [`RESTART_INTERVAL`]
//!   entries (the key written whole there), then the restart offsets (u32 LE)
//!   and their count (u32 LE);
//! - after each block a 5-byte trailer: the compression type (0, none) and
//!   the masked CRC-32C of the block and that byte;
//! - an empty metaindex block, then the index block: per data block a key
//!   ≥ its last key (dtf writes the last key itself, which is always a valid
//!   separator) → its `BlockHandle` (varint64 offset, varint64 size);
//! - the 48-byte footer: the metaindex and index handles, zero-padded to 40
//!   bytes, then the magic `0xdb4775248b80fb57` (u64 LE).
//!
//! [`parse`] reads such a table back with every length checked against the
//! bytes there are: a damaged file is an error saying what is wrong, never a
//! panic or an allocation larger than the file.

/// The footer's magic number (`kTableMagicNumber`).
pub const MAGIC: u64 = 0xdb47_7524_8b80_fb57;
/// The footer's length: two handles of at most 20 bytes each, the magic.
pub const FOOTER_LEN: usize = 48;
/// Compression type, CRC.
const TRAILER_LEN: usize = 5;
/// Entries between restart points in a data block (TensorFlow's default).
const RESTART_INTERVAL: usize = 16;
/// A data block is closed once it holds this much (TensorFlow's
/// `table::Options::block_size`, 256 KiB).
const BLOCK_SIZE: usize = 256 << 10;
/// The longest key read: a tensor's name (TensorFlow's are far shorter).
const MAX_KEY_BYTES: u64 = 64 << 10;
/// How many times its own size a table may grow to as its keys are
/// expanded: prefix compression of names saves a few times at most, and a
/// hostile table of ever longer shared prefixes must not make a file of
/// megabytes into gigabytes of keys.
const MAX_EXPANSION: u64 = 16;
/// Added after rotating a CRC, so that a CRC of data holding CRCs is not
/// itself trivially related to them (`crc32c::Mask`).
const MASK_DELTA: u32 = 0xa282_ead8;

/// One (key, value) of a table.
pub type Entry = (Vec<u8>, Vec<u8>);

/// One (key, value) of a block, the value still in the file's bytes.
type BlockEntry<'a> = (Vec<u8>, &'a [u8]);

/// TensorFlow's (and LevelDB's) masked CRC-32C.
pub fn mask(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(MASK_DELTA)
}

/// The inverse of [`mask`].
pub fn unmask(masked: u32) -> u32 {
    masked.wrapping_sub(MASK_DELTA).rotate_left(15)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Builds one block: entries with shared prefixes and restart points.
struct BlockBuilder {
    /// The block so far.
    buf: Vec<u8>,
    /// Offsets of the restart points.
    restarts: Vec<u32>,
    /// Entries since the last restart point.
    counter: usize,
    /// The previous key, for the shared prefix.
    last_key: Vec<u8>,
    /// Entries between restart points.
    interval: usize,
}

impl BlockBuilder {
    fn new(interval: usize) -> Self {
        BlockBuilder {
            buf: Vec::new(),
            restarts: vec![0],
            counter: 0,
            last_key: Vec::new(),
            interval,
        }
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    fn add(&mut self, key: &[u8], value: &[u8]) {
        let shared = if self.counter < self.interval {
            key.iter()
                .zip(&self.last_key)
                .take_while(|(a, b)| a == b)
                .count()
        } else {
            self.restarts.push(self.buf.len() as u32);
            self.counter = 0;
            0
        };
        put_varint(&mut self.buf, shared as u64);
        put_varint(&mut self.buf, (key.len() - shared) as u64);
        put_varint(&mut self.buf, value.len() as u64);
        self.buf.extend_from_slice(&key[shared..]);
        self.buf.extend_from_slice(value);
        self.last_key = key.to_vec();
        self.counter += 1;
    }

    /// The block's bytes; the builder starts afresh.
    fn finish(&mut self) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.buf);
        for r in &self.restarts {
            out.extend_from_slice(&r.to_le_bytes());
        }
        out.extend_from_slice(&(self.restarts.len() as u32).to_le_bytes());
        *self = BlockBuilder::new(self.interval);
        out
    }
}

/// Appends `block` and its trailer to `out`; returns its handle (offset, size).
fn write_block(out: &mut Vec<u8>, block: &[u8]) -> (u64, u64) {
    let handle = (out.len() as u64, block.len() as u64);
    out.extend_from_slice(block);
    let crc = crc32c::crc32c_append(crc32c::crc32c(block), &[0]);
    out.push(0);
    out.extend_from_slice(&mask(crc).to_le_bytes());
    handle
}

fn put_handle(out: &mut Vec<u8>, (offset, size): (u64, u64)) {
    put_varint(out, offset);
    put_varint(out, size);
}

/// The table of `entries`, which must be sorted by key, strictly ascending
/// (bytewise, as TensorFlow compares them).
pub fn build(entries: &[Entry]) -> Vec<u8> {
    debug_assert!(entries.windows(2).all(|w| w[0].0 < w[1].0));
    let mut out = Vec::new();
    let mut data = BlockBuilder::new(RESTART_INTERVAL);
    // TensorFlow's index block restarts at every entry.
    let mut index = BlockBuilder::new(1);
    for (key, value) in entries {
        data.add(key, value);
        if data.buf.len() >= BLOCK_SIZE {
            let last = data.last_key.clone();
            let handle = write_block(&mut out, &data.finish());
            index.add(&last, &handle_bytes(handle));
        }
    }
    if !data.is_empty() {
        let last = data.last_key.clone();
        let handle = write_block(&mut out, &data.finish());
        index.add(&last, &handle_bytes(handle));
    }
    let meta = write_block(&mut out, &BlockBuilder::new(RESTART_INTERVAL).finish());
    let index = write_block(&mut out, &index.finish());
    let mut footer = Vec::with_capacity(FOOTER_LEN);
    put_handle(&mut footer, meta);
    put_handle(&mut footer, index);
    footer.resize(FOOTER_LEN - 8, 0);
    footer.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&footer);
    out
}

fn handle_bytes(handle: (u64, u64)) -> Vec<u8> {
    let mut v = Vec::new();
    put_handle(&mut v, handle);
    v
}

/// Reads bytes from a slice with every length checked.
struct Cursor<'a> {
    /// What is left.
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn varint(&mut self, what: &str) -> Result<u64, String> {
        let mut v = 0u64;
        for i in 0..10 {
            let Some((&b, rest)) = self.rest.split_first() else {
                return Err(format!("{what}: the varint runs past the end"));
            };
            self.rest = rest;
            if i == 9 && b > 1 {
                return Err(format!("{what}: a varint longer than 64 bits"));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("{what}: a varint longer than 64 bits"))
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], String> {
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.rest.len())
            .ok_or_else(|| {
                format!(
                    "{what}: {n} bytes claimed, {} left in the block",
                    self.rest.len()
                )
            })?;
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}

/// The block `handle` names in `file`, its trailer's type and CRC checked.
fn block<'a>(file: &'a [u8], (offset, size): (u64, u64), what: &str) -> Result<&'a [u8], String> {
    let end = offset
        .checked_add(size)
        .and_then(|e| e.checked_add(TRAILER_LEN as u64))
        .filter(|&e| e <= (file.len() - FOOTER_LEN) as u64)
        .ok_or_else(|| {
            format!(
                "the {what} block at offset {offset}, {size} bytes, runs past the table's \
                 {} bytes (truncated?)",
                file.len() - FOOTER_LEN
            )
        })?;
    let (start, end) = (offset as usize, end as usize);
    let contents = &file[start..end - TRAILER_LEN];
    let kind = file[end - TRAILER_LEN];
    let stored = u32_at(file, end - 4);
    let actual = crc32c::crc32c_append(crc32c::crc32c(contents), &[kind]);
    if unmask(stored) != actual {
        return Err(format!(
            "the {what} block at offset {offset}: CRC-32C mismatch (stored {:#010x}, \
             computed {:#010x}): the file is damaged",
            unmask(stored),
            actual
        ));
    }
    if kind != 0 {
        return Err(format!(
            "the {what} block at offset {offset} is compressed (type {kind}); dtf reads \
             uncompressed tables only, as TensorFlow writes checkpoints"
        ));
    }
    Ok(contents)
}

/// The entries of one block, in order; `budget`: the bytes of keys and
/// values that may still be produced, less what these take.
fn entries<'a>(
    block: &'a [u8],
    what: &str,
    budget: &mut u64,
) -> Result<Vec<BlockEntry<'a>>, String> {
    if block.len() < 4 {
        return Err(format!(
            "the {what} block has {} bytes, too few for its restart count",
            block.len()
        ));
    }
    let restarts = u32_at(block, block.len() - 4) as usize;
    let data_len = restarts
        .checked_mul(4)
        .and_then(|r| (block.len() - 4).checked_sub(r))
        .ok_or_else(|| {
            format!(
                "the {what} block claims {restarts} restart points, more than its {} bytes hold",
                block.len()
            )
        })?;
    let mut cursor = Cursor {
        rest: &block[..data_len],
    };
    let mut out: Vec<BlockEntry<'a>> = Vec::new();
    let mut key: Vec<u8> = Vec::new();
    while !cursor.rest.is_empty() {
        let shared = cursor.varint(what)?;
        let unshared = cursor.varint(what)?;
        let value_len = cursor.varint(what)?;
        if shared > key.len() as u64 {
            return Err(format!(
                "the {what} block: an entry shares {shared} bytes with a previous key of {}",
                key.len()
            ));
        }
        if shared.saturating_add(unshared) > MAX_KEY_BYTES {
            return Err(format!(
                "the {what} block: a key of {} bytes, more than the {MAX_KEY_BYTES} a \
                 tensor's name may have here",
                shared.saturating_add(unshared)
            ));
        }
        key.truncate(shared as usize);
        key.extend_from_slice(cursor.take(unshared, what)?);
        let value = cursor.take(value_len, what)?;
        *budget = budget
            .checked_sub(key.len() as u64 + value.len() as u64)
            .ok_or_else(|| {
                format!(
                    "the {what} block: its keys expand to more than {MAX_EXPANSION} times \
                     the table's size (damaged or hostile)"
                )
            })?;
        if out.last().is_some_and(|(last, _)| *last >= key) {
            return Err(format!(
                "the {what} block: its keys are not in ascending order"
            ));
        }
        out.push((key.clone(), value));
    }
    Ok(out)
}

fn handle(cursor: &mut Cursor<'_>, what: &str) -> Result<(u64, u64), String> {
    Ok((cursor.varint(what)?, cursor.varint(what)?))
}

/// Every (key, value) of the table `file`, in key order. The error says
/// what is wrong, for the caller to name the file.
pub fn parse(file: &[u8]) -> Result<Vec<Entry>, String> {
    if file.len() < FOOTER_LEN {
        return Err(format!(
            "{} bytes, shorter than a table's {FOOTER_LEN}-byte footer (truncated?)",
            file.len()
        ));
    }
    let footer = &file[file.len() - FOOTER_LEN..];
    let mut magic = [0u8; 8];
    magic.copy_from_slice(&footer[FOOTER_LEN - 8..]);
    if u64::from_le_bytes(magic) != MAGIC {
        return Err(format!(
            "no table magic number at the end ({:#018x}, expected {MAGIC:#018x}): not a \
             TensorFlow checkpoint index, or truncated",
            u64::from_le_bytes(magic)
        ));
    }
    let mut cursor = Cursor {
        rest: &footer[..FOOTER_LEN - 8],
    };
    let meta_handle = handle(&mut cursor, "footer")?;
    let index_handle = handle(&mut cursor, "footer")?;
    // Nothing dtf needs is in the metaindex (TensorFlow puts no filter in a
    // checkpoint), but a damaged one is a damaged file.
    let mut budget = (file.len() as u64).saturating_mul(MAX_EXPANSION);
    entries(
        block(file, meta_handle, "metaindex")?,
        "metaindex",
        &mut budget,
    )?;
    let index = block(file, index_handle, "index")?;
    let mut out: Vec<Entry> = Vec::new();
    for (separator, value) in entries(index, "index", &mut budget)? {
        let mut cursor = Cursor { rest: value };
        let data_handle = handle(&mut cursor, "index")?;
        let data = block(file, data_handle, "data")?;
        for (key, value) in entries(data, "data", &mut budget)? {
            if key > separator {
                return Err(
                    "a data block holds a key past its index entry: the index is damaged".into(),
                );
            }
            if out.last().is_some_and(|(last, _)| *last >= key) {
                return Err("the data blocks' keys are not in ascending order".into());
            }
            out.push((key, value.to_vec()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: usize, value_len: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
        (0..n)
            .map(|i| {
                (
                    format!("layer{}/weights/{i:05}", i % 7).into_bytes(),
                    vec![i as u8; value_len],
                )
            })
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_iter()
            .collect()
    }

    #[test]
    fn mask_is_leveldbs_and_unmask_undoes_it() {
        // LevelDB's crc32c_test: Mask(crc) != crc, Unmask(Mask(x)) == x.
        let crc = crc32c::crc32c(b"foo");
        assert_ne!(mask(crc), crc);
        assert_eq!(unmask(mask(crc)), crc);
        assert_eq!(mask(0), 0xa282_ead8);
        // The CRC-32C of 32 zero bytes is 0x8a9136aa (RFC 3720).
        assert_eq!(crc32c::crc32c(&[0; 32]), 0x8a91_36aa);
    }

    #[test]
    fn round_trips_one_block_and_many() {
        for (n, len) in [(0, 0), (1, 0), (3, 10), (40, 3), (300, 2000)] {
            let entries = sample(n, len);
            let table = build(&entries);
            assert_eq!(parse(&table).unwrap(), entries, "{n} entries");
        }
        // 300 × 2000 bytes: more than one data block.
        let table = build(&sample(300, 2000));
        assert!(table.len() > 2 * BLOCK_SIZE);
    }

    #[test]
    fn the_empty_key_sorts_first_and_reads_back() {
        let entries = vec![
            (Vec::new(), b"header".to_vec()),
            (b"a".to_vec(), b"1".to_vec()),
        ];
        assert_eq!(parse(&build(&entries)).unwrap(), entries);
    }

    #[test]
    fn every_flipped_byte_and_every_truncation_is_an_error_not_a_panic() {
        let table = build(&sample(40, 3));
        // The footer's zero padding after the two handles is never read.
        let footer = &table[table.len() - FOOTER_LEN..table.len() - 8];
        let mut cursor = Cursor { rest: footer };
        handle(&mut cursor, "").unwrap();
        handle(&mut cursor, "").unwrap();
        let padding = table.len() - 8 - cursor.rest.len()..table.len() - 8;
        for at in 0..table.len() {
            let mut bad = table.clone();
            bad[at] ^= 0x40;
            if padding.contains(&at) {
                continue;
            }
            assert!(parse(&bad).is_err(), "flipped byte {at} passed");
        }
        for len in 0..table.len() {
            assert!(parse(&table[..len]).is_err(), "truncated to {len} passed");
        }
    }

    #[test]
    fn ever_longer_shared_prefixes_are_refused_not_expanded() {
        // Each entry shares the whole previous key and adds one byte: 4
        // bytes in the file, a key as long as all before it in memory.
        let mut block = BlockBuilder::new(usize::MAX);
        let mut key = vec![b'a'; 4000];
        for _ in 0..4000 {
            key.push(b'a');
            block.add(&key, b"");
        }
        let mut file = Vec::new();
        let data = write_block(&mut file, &block.finish());
        let mut index = BlockBuilder::new(1);
        index.add(&key, &handle_bytes(data));
        let meta = write_block(&mut file, &BlockBuilder::new(16).finish());
        let idx = write_block(&mut file, &index.finish());
        let mut footer = Vec::new();
        put_handle(&mut footer, meta);
        put_handle(&mut footer, idx);
        footer.resize(FOOTER_LEN - 8, 0);
        footer.extend_from_slice(&MAGIC.to_le_bytes());
        file.extend_from_slice(&footer);
        let err = parse(&file).unwrap_err();
        assert!(err.contains("expand"), "{err}");
    }

    #[test]
    fn hostile_lengths_are_refused() {
        // An index handle claiming an exabyte, with the magic in place.
        let mut footer = Vec::new();
        put_handle(&mut footer, (0, 0));
        put_handle(&mut footer, (u64::MAX - 3, u64::MAX));
        footer.resize(FOOTER_LEN - 8, 0);
        footer.extend_from_slice(&MAGIC.to_le_bytes());
        let err = parse(&footer).unwrap_err();
        assert!(err.contains("runs past"), "{err}");
        // A block claiming 2^32-1 restart points.
        let mut file = Vec::new();
        let meta = write_block(&mut file, &BlockBuilder::new(16).finish());
        let idx = write_block(&mut file, &u32::MAX.to_le_bytes());
        let mut f = Vec::new();
        put_handle(&mut f, meta);
        put_handle(&mut f, idx);
        f.resize(FOOTER_LEN - 8, 0);
        f.extend_from_slice(&MAGIC.to_le_bytes());
        file.extend_from_slice(&f);
        let err = parse(&file).unwrap_err();
        assert!(err.contains("restart points"), "{err}");
    }
}
