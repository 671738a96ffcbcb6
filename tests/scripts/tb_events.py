#!/usr/bin/env python3
"""tb_events.py EVENTS_FILE METRICS_CSV - read a TensorBoard event file with
a reader written here from the format's definition (TFRecord framing with
masked CRC32C, tensorflow.Event protocol buffers), independent of the C
writer, and check every record's checksums and that its scalars equal the
metrics file's values (to float precision). Prints 'ok N scalars' or the problem."""
import csv, struct, sys

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

def varint(b, i):
    v = shift = 0
    while True:
        c = b[i]; i += 1
        v |= (c & 0x7F) << shift; shift += 7
        if not c & 0x80:
            return v, i

def fields(b):
    i, out = 0, []
    while i < len(b):
        key, i = varint(b, i)
        f, w = key >> 3, key & 7
        if w == 0:
            v, i = varint(b, i)
        elif w == 1:
            v = b[i:i + 8]; i += 8
        elif w == 5:
            v = b[i:i + 4]; i += 4
        elif w == 2:
            n, i = varint(b, i); v = b[i:i + n]; i += n
        else:
            raise ValueError("wire type %d" % w)
        out.append((f, w, v))
    return out

def main(events, metrics):
    raw = open(events, 'rb').read()
    i, records = 0, []
    while i < len(raw):
        head = raw[i:i + 8]
        (n,) = struct.unpack('<Q', head)
        if struct.unpack('<I', raw[i + 8:i + 12])[0] != masked(head):
            return "bad length crc at %d" % i
        data = raw[i + 12:i + 12 + n]
        if struct.unpack('<I', raw[i + 12 + n:i + 16 + n])[0] != masked(data):
            return "bad data crc at %d" % i
        records.append(data); i += 16 + n
    first = dict((f, v) for f, _, v in fields(records[0]))
    if first.get(3) != b'brain.Event:2':
        return "first record is not file_version brain.Event:2"
    got = {}
    for rec in records[1:]:
        ev = {f: v for f, _, v in fields(rec)}
        step = ev[2]
        for f, _, val in fields(ev[5]):
            vf = {g: v for g, _, v in fields(val)}
            got[(vf[1].decode(), step)] = struct.unpack('<f', vf[2])[0]
    names = {'loss': 'train/loss', 'val_loss': 'eval/val_loss', 'lr': 'train/lr',
             'grad_norm': 'train/grad_norm', 'tokens_per_s': 'perf/tokens_per_s',
             'mfu': 'perf/mfu', 'skipped': 'train/skipped'}
    want = {}
    for row in csv.DictReader(open(metrics)):
        for col, tag in names.items():
            if row.get(col, '') != '':
                want[(tag, int(row['step']))] = struct.unpack('<f', struct.pack('<f', float(row[col])))[0]
    # the CSV holds %.9g of the double, the event the float: equal to float
    # precision (a relative 1e-6)
    bad = [k for k in set(want) | set(got)
           if k not in want or k not in got or abs(want[k] - got[k]) > 1e-6 * abs(want[k])]
    if bad:
        return "scalars differ from the metrics: %s" % [(k, want.get(k), got.get(k)) for k in sorted(bad)[:4]]
    return "ok %d scalars" % len(got)

if __name__ == '__main__':
    print(main(sys.argv[1], sys.argv[2]))
