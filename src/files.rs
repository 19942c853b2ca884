//! Files that come from outside (configuration, secrets, checkpoints): dtf
//! reads only regular files, so a FIFO or a device named like one of its
//! files is refused by name instead of blocking or reading forever. Each
//! reader bounds its size by what its format allows.

use std::fs::FileType;
use std::os::unix::fs::FileTypeExt;

/// What a file of type `t` is, in words, when it is not a regular file;
/// `None` for a regular file.
pub fn special_kind(t: FileType) -> Option<&'static str> {
    Some(if t.is_file() {
        return None;
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_dir() {
        "a directory"
    } else {
        "a special file"
    })
}
