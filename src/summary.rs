//! TensorBoard summaries: the chief's `events.out.tfevents.<secs>.<host>` file
//! in `checkpoint.dir`, as TensorFlow's `SummarySaverHook` writes it.
//!
//! The file is a TFRecord stream of `Event` protos (`proto/tensorboard/`):
//! first one with `file_version: "brain.Event:2"`, then scalar summaries.
//! Each record is framed as
//! `u64 LE length | masked CRC32C(length) | data | masked CRC32C(data)`.
//!
//! [`EventWriter`] writes records; [`Summaries`] is the chief's schedule
//! (every `train.save_summaries_steps` global steps, and the evaluation at the
//! end). Writing is a small buffered write plus a flush (no fsync): a few
//! hundred bytes per summary, so it does not need a task of its own.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tracing::warn;

/// Generated from `proto/tensorboard/event.proto`.
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/tensorboard.rs"));
}

/// The `file_version` TensorBoard expects in a file's first event.
pub const FILE_VERSION: &str = "brain.Event:2";

/// A summary file that cannot be created or written.
#[derive(Debug, thiserror::Error)]
#[error("summary file {path}: {source}")]
pub struct SummaryError {
    /// The events file (or the directory it was to go in).
    pub path: PathBuf,
    pub source: std::io::Error,
}

/// TFRecord's checksum: CRC32C, rotated and offset so that a CRC of data that
/// itself contains CRCs does not degenerate.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// One TFRecord: length, its masked CRC, the data, the data's masked CRC.
pub fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// This machine's host name, as TensorFlow puts it in the file name.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // on success when the name fits, and we stop at the first NUL anyway.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let name = if rc == 0 {
        String::from_utf8_lossy(buf.split(|&b| b == 0).next().unwrap_or_default()).into_owned()
    } else {
        String::new()
    };
    if name.is_empty() {
        "localhost".into()
    } else {
        name
    }
}

/// Appends `Event` records to one events file.
pub struct EventWriter {
    /// The file's path, for errors and logs.
    path: PathBuf,
    /// Buffered, flushed after every record so a reader sees whole records.
    out: BufWriter<File>,
}

impl EventWriter {
    /// Creates `dir` if needed and opens `events.out.tfevents.<unix secs>.<hostname>`
    /// in it, then writes the `file_version` event.
    ///
    /// Errors: [`SummaryError`] if the directory or file cannot be created or written.
    pub fn create(dir: &Path) -> Result<Self, SummaryError> {
        std::fs::create_dir_all(dir).map_err(|source| SummaryError {
            path: dir.to_path_buf(),
            source,
        })?;
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let path = dir.join(format!("events.out.tfevents.{secs}.{}", hostname()));
        // Append: a chief restarted within the same second continues the file
        // (a second file_version record is harmless to readers).
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| SummaryError {
                path: path.clone(),
                source,
            })?;
        let mut w = Self {
            path,
            out: BufWriter::new(file),
        };
        w.write(&pb::Event {
            wall_time: now_secs(),
            step: 0,
            what: Some(pb::event::What::FileVersion(FILE_VERSION.into())),
        })?;
        Ok(w)
    }

    /// The events file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one event as a TFRecord and flushes it.
    ///
    /// Errors: [`SummaryError`] if the write fails.
    pub fn write(&mut self, event: &pb::Event) -> Result<(), SummaryError> {
        use prost::Message;
        let record = frame(&event.encode_to_vec());
        self.out
            .write_all(&record)
            .and_then(|()| self.out.flush())
            .map_err(|source| SummaryError {
                path: self.path.clone(),
                source,
            })
    }

    /// Writes scalar summaries `(tag, value)` at `step`.
    ///
    /// Errors: [`SummaryError`] if the write fails.
    pub fn scalars(&mut self, step: u64, values: &[(&str, f32)]) -> Result<(), SummaryError> {
        let summary = pb::Summary {
            value: values
                .iter()
                .map(|&(tag, v)| pb::summary::Value {
                    tag: tag.into(),
                    value: Some(pb::summary::value::Value::SimpleValue(v)),
                })
                .collect(),
        };
        self.write(&pb::Event {
            wall_time: now_secs(),
            step: step as i64,
            what: Some(pb::event::What::Summary(summary)),
        })
    }
}

/// The chief's summaries: when to write, and what.
///
/// A summary is written for the first step the chief computes and then each
/// time the global step its parameters were read at reaches the next multiple
/// of `train.save_summaries_steps`. The event's step is that read step, so
/// `loss` and `learning_rate` are exactly those of that step. When the chief
/// sees every step (one worker, or sync mode) the steps are the multiples
/// themselves; in async mode with several workers the global step can jump
/// over a multiple, and the summary is written at the first step past it.
pub struct Summaries {
    /// None after a failed create or write: summaries are then off for the
    /// run (logged once); training never stops for them.
    writer: Option<EventWriter>,
    /// The next step at or past which to write.
    next: u64,
    /// The `train.save_summaries_steps` that `next` was computed with: a
    /// reload that changes it moves `next` at once, rather than after the
    /// old interval (a million steps, say) has run out.
    every: u64,
    /// The step and time of the previous summary, for `global_step/sec`.
    last: Option<(u64, Instant)>,
}

impl Summaries {
    /// Opens a new events file in `dir`; on failure logs a warning and writes nothing.
    pub fn open(dir: &Path) -> Self {
        let writer = EventWriter::create(dir)
            .map_err(|e| warn!(error = %e, "TensorBoard summaries are off."))
            .ok();
        Self {
            writer,
            next: 0,
            every: 0,
            last: None,
        }
    }

    /// The events file, if summaries are on.
    pub fn path(&self) -> Option<&Path> {
        self.writer.as_ref().map(|w| w.path())
    }

    fn write(&mut self, step: u64, values: &[(&str, f32)]) {
        if let Some(w) = &mut self.writer
            && let Err(e) = w.scalars(step, values)
        {
            warn!(error = %e, "Summary not written; TensorBoard summaries are off for this run.");
            self.writer = None;
        }
    }

    /// After a training step computed at global step `step` with `loss` and
    /// `learning_rate`: writes `loss`, `learning_rate` and `global_step/sec`
    /// if a summary is due (`every`: `train.save_summaries_steps`).
    pub fn on_step(&mut self, step: u64, every: u64, loss: f32, learning_rate: f32) {
        let every = every.max(1);
        if every != self.every {
            self.every = every;
            if let Some((prev, _)) = self.last {
                self.next = (prev / every + 1) * every;
            }
        }
        if step < self.next {
            return;
        }
        self.next = (step / every + 1) * every;
        let now = Instant::now();
        match self.last {
            Some((prev, at)) if step > prev => {
                let rate = (step - prev) as f64 / now.duration_since(at).as_secs_f64().max(1e-9);
                self.write(
                    step,
                    &[
                        ("loss", loss),
                        ("learning_rate", learning_rate),
                        ("global_step/sec", rate as f32),
                    ],
                );
            }
            // No interval yet to measure a rate over (TensorFlow's StepCounterHook skips it too).
            _ => self.write(step, &[("loss", loss), ("learning_rate", learning_rate)]),
        }
        self.last = Some((step, now));
    }

    /// The final evaluation's scores at `step`: the test accuracy of the variables and of
    /// their EMA shadows, or a regression model's RMSE and MAE
    /// ([`crate::eval::Scores::present`]).
    pub fn on_eval(&mut self, step: u64, scores: &[(&str, f32)]) {
        self.write(step, scores);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Splits a TFRecord stream, checking both CRCs of every record.
    fn records(mut bytes: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            assert_eq!(
                u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
                masked_crc32c(&bytes[..8])
            );
            let data = &bytes[12..12 + len];
            assert_eq!(
                u32::from_le_bytes(bytes[12 + len..16 + len].try_into().unwrap()),
                masked_crc32c(data)
            );
            out.push(data.to_vec());
            bytes = &bytes[16 + len..];
        }
        out
    }

    #[test]
    fn crc32c_and_mask_match_the_published_values() {
        // CRC-32C check value (RFC 3720 / iSCSI).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        let crc = 0xe306_9283u32;
        // The mask exactly as the TFRecord format spells it.
        #[allow(clippy::manual_rotate)]
        let spelled = ((crc >> 15) | (crc << 17)).wrapping_add(0xa282_ead8);
        assert_eq!(masked_crc32c(b"123456789"), spelled);
        // TensorFlow's masked CRC of an empty string (crc32c("") = 0).
        assert_eq!(masked_crc32c(b""), 0xa282_ead8);
    }

    #[test]
    fn frame_is_length_crc_data_crc() {
        let f = frame(b"abc");
        assert_eq!(f.len(), 3 + 16);
        assert_eq!(&f[..8], &3u64.to_le_bytes());
        assert_eq!(&f[12..15], b"abc");
        assert_eq!(records(&f), vec![b"abc".to_vec()]);
    }

    #[test]
    fn writer_starts_with_file_version_then_scalars_on_schedule() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Summaries::open(dir.path());
        let path = s.path().unwrap().to_path_buf();
        assert!(
            path.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("events.out.tfevents.")
        );
        for step in [0, 3, 9, 10, 11, 25, 31] {
            s.on_step(step, 10, step as f32, 0.5);
        }
        s.on_eval(31, &[("accuracy", 0.75), ("ema_accuracy", 0.8)]);
        let events: Vec<pb::Event> = records(&std::fs::read(&path).unwrap())
            .iter()
            .map(|r| pb::Event::decode(r.as_slice()).unwrap())
            .collect();
        assert_eq!(
            events[0].what,
            Some(pb::event::What::FileVersion(FILE_VERSION.into()))
        );
        let steps: Vec<i64> = events[1..].iter().map(|e| e.step).collect();
        assert_eq!(steps, vec![0, 10, 25, 31, 31]);
        let tags = |e: &pb::Event| match &e.what {
            Some(pb::event::What::Summary(s)) => {
                s.value.iter().map(|v| v.tag.clone()).collect::<Vec<_>>()
            }
            _ => vec![],
        };
        assert_eq!(tags(&events[1]), ["loss", "learning_rate"]);
        assert_eq!(
            tags(&events[2]),
            ["loss", "learning_rate", "global_step/sec"]
        );
        assert_eq!(tags(&events[5]), ["accuracy", "ema_accuracy"]);
    }

    #[test]
    fn a_reloaded_interval_applies_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Summaries::open(dir.path());
        let path = s.path().unwrap().to_path_buf();
        for step in [0, 5, 10] {
            s.on_step(step, 1_000_000, 1.0, 0.5);
        }
        // save_summaries_steps reloaded from a million to 4: the multiple of 4
        // after the last summary (step 0) is long past, so step 11 is written
        // at once, then every multiple.
        for step in [11, 12, 13, 16] {
            s.on_step(step, 4, 1.0, 0.5);
        }
        let steps: Vec<i64> = records(&std::fs::read(&path).unwrap())[1..]
            .iter()
            .map(|r| pb::Event::decode(r.as_slice()).unwrap().step)
            .collect();
        assert_eq!(steps, vec![0, 11, 12, 16]);
    }
}
