#!/usr/bin/env python3
"""Read a dtf TensorBoard events file with TensorBoard's own code.

Usage: python3 tests/read_events.py EVENTS_FILE
       python3 tests/read_events.py --accumulator RUN_DIR

Prints one JSON object:
{"records": n, "file_version": "brain.Event:2",
 "events": [{"step": s, "wall_time": t, "scalars": {"loss": x, ...}}, ...]}

This is the independent reader the Rust writer is checked against. It needs
the `tensorboard` package (`python3 -m pip install tensorboard`), not
TensorFlow. Two passes:

1. TensorBoard's record reader (the pure-Python TFRecord reader TensorBoard
   falls back to without TensorFlow) walks every record to the end of the file
   and raises on a bad length or data CRC — `EventFileLoader` alone would
   swallow such an error and stop early.
2. `EventFileLoader`, what TensorBoard itself loads runs with, decodes the
   events; scalars are read whether they come back as `simple_value` or
   migrated to a scalar tensor.

With --accumulator, the directory is read as TensorBoard reads a run, by
`EventAccumulator` (every events file in it, in order), and the output is
{"scalars": {"tag": [[step, value], ...], ...}}.
"""

import json
import sys

from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow
from tensorboard.util import tensor_util


def count_records(path):
    """The number of records, every CRC checked; raises DataLossError on damage."""
    reader = pywrap_tensorflow.PyRecordReader_New(path, 0, None, None)
    n = 0
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return n
        n += 1


def scalar(value):
    if value.HasField("tensor"):
        return float(tensor_util.make_ndarray(value.tensor).item())
    return float(value.simple_value)


def accumulate(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
        SCALARS,
    )

    acc = EventAccumulator(run_dir, size_guidance={SCALARS: 0})
    acc.Reload()
    scalars = {
        tag: [[e.step, e.value] for e in acc.Scalars(tag)]
        for tag in acc.Tags()["scalars"]
    }
    json.dump({"scalars": scalars}, sys.stdout)
    print()


def main():
    if sys.argv[1] == "--accumulator":
        accumulate(sys.argv[2])
        return
    path = sys.argv[1]
    records = count_records(path)
    out = {"records": records, "file_version": None, "events": []}
    for event in EventFileLoader(path).Load():
        if event.HasField("file_version"):
            out["file_version"] = out["file_version"] or event.file_version
            continue
        if event.HasField("summary"):
            out["events"].append({
                "step": event.step,
                "wall_time": event.wall_time,
                "scalars": {v.tag: scalar(v) for v in event.summary.value},
            })
    decoded = len(out["events"]) + (1 if out["file_version"] else 0)
    if decoded != records:
        sys.exit(f"{path}: {records} records but only {decoded} events decoded")
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
