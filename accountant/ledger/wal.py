"""A damaged SQLite ``-wal``: the commits SQLite's recovery would drop, found before it runs.

SQLite's recovery, which a process opening a WAL-mode database after a crash runs, ends the WAL at
the first frame whose checksum fails: every later commit is dropped, and a ledger's shorter chain
audits clean (issue 32: one flipped byte, 109 of 150 trials lost committed records). Each frame
carries the salts of the WAL it belongs to and is checksummed on the *stored* checksum of the frame
before it, so a frame after the damage still verifies on its own: a commit frame of this WAL that
verifies after one that does not is a commit SQLite would drop. Frames of an earlier WAL that a
restarted one has not overwritten yet carry other salts and are not counted.

Nothing is added to a commit: the ledger reads its ``-wal`` once, at open. Not seen: damage within
the WAL's last frame, or in the checksum that frame is seeded on (a crash while writing the last
frame leaves the same).
"""

from __future__ import annotations

import struct

__all__ = ["dropped_commits"]


def dropped_commits(wal: str) -> int:
    """How many commits of this ``-wal`` SQLite's recovery would drop: commit frames with the
    header's salts that verify on their own after the first frame that does not; 1 when the
    header itself is damaged (SQLite would ignore every frame). The WAL format: https://www.sqlite.org/fileformat2.html#walformat."""
    try:
        with open(wal, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return 0
    if len(data) < 32 + 24:
        return 0  # (empty, or never written past its header: no commit in it)
    if data[:4] not in (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83"):
        return 1  # (its header damaged: SQLite would ignore every frame)
    order = ">" if data[3] & 1 else "<"  # the byte order of the checksums (the magic's last bit)
    page = struct.unpack(">I", data[8:12])[0]

    def checksum(seed: tuple[int, int], chunk: bytes) -> tuple[int, int]:
        s0, s1 = seed
        words = struct.unpack(f"{order}{len(chunk) // 4}I", chunk)
        for i in range(0, len(words), 2):
            s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
            s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
        return s0, s1

    salts, stored = data[16:24], struct.unpack(">II", data[24:32])
    if checksum((0, 0), data[:24]) != stored:
        return 1  # (its header damaged: SQLite would ignore every frame)
    valid = True
    dropped = 0
    for at in range(32, len(data) - 24 - page + 1, 24 + page):
        head = data[at:at + 24]
        mine = checksum(checksum(stored, head[:8]), data[at + 24:at + 24 + page])
        stored = struct.unpack(">II", head[16:24])
        if head[8:16] != salts:  # (a frame of an earlier WAL not overwritten yet: SQLite stops)
            valid = False
            continue
        valid = valid and mine == stored
        if not valid and mine == stored and struct.unpack(">I", head[4:8])[0]:
            dropped += 1
    return dropped
