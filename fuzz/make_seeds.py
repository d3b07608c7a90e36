#!/usr/bin/env python3
"""fuzz/make_seeds.py — writes the fuzzers' seed corpora, fuzz/corpus/<name>/: small valid files
of each format (from the golden files and Debian's Fashion-MNIST where they serve), a few
truncated or broken variants, and nothing over a few kB. Deterministic; needs only Python's
standard library and, for the JPEG, BMP and TGA seeds, a C compiler and libstb-dev's
stb_image_write.h. Files named regression-* are inputs that once crashed a reader
(docs/fuzzing.md); this script leaves them alone.

    python3 fuzz/make_seeds.py
"""

import gzip
import json
import os
import pathlib
import struct
import subprocess
import tempfile
import zlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"
GOLDEN = ROOT / "tests" / "golden"
FASHION = pathlib.Path("/usr/share/datasets/fashion-mnist")


def write_corpus(name, files):
    folder = CORPUS / name
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.iterdir():
        if not old.name.startswith("regression-"):
            old.unlink()
    for file_name, data in files.items():
        assert len(data) <= 16 * 1024, f"{name}/{file_name}: {len(data)} bytes"
        (folder / file_name).write_bytes(data)
    print(f"{name}: {len(files)} seeds, {sum(len(d) for d in files.values())} bytes")


def gzip_bytes(data):
    return gzip.compress(data, mtime=0)


# ------------------------------------------------------------------ safetensors

def safetensors(tensors, metadata=None, pad=True):
    """tensors: [(name, dtype, shape, bytes)] -> a file, data back to back in the given order."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def safetensors_seeds():
    dtypes = (GOLDEN / "dtypes.safetensors").read_bytes()
    f32 = struct.pack("<6f", 1, -2, 3.5, 0, float("inf"), float("nan"))
    seeds = {
        "dtypes.safetensors": dtypes,  # every dtype, an empty tensor, a scalar, metadata
        "f32.safetensors": safetensors([("w", "F32", [2, 3], f32)]),
        "metadata.safetensors": safetensors([("b", "U8", [4], b"\x01\x02\x03\x04")],
                                            {"format": "pt", "step": "7"}),
        "empty_header.safetensors": safetensors([]),
        "unpadded.safetensors": safetensors([("x", "I32", [1], b"\x2a\0\0\0")], pad=False),
        "bool.safetensors": safetensors([("m", "BOOL", [3], b"\x00\x01\x07")]),
        "two.safetensors": safetensors([("a", "BF16", [2], b"\x80\x3f\x00\x40"),
                                        ("c", "F16", [1, 1], b"\x00\x3c"),
                                        ("z", "I64", [0], b"")]),
    }
    # A gap between tensors (allowed) and an overlap (refused): offsets written by hand.
    gap = b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},' \
          b'"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}'
    seeds["gap.safetensors"] = struct.pack("<Q", len(gap)) + gap + b"abcdef"
    overlap = gap.replace(b"[4,6]", b"[1,3]")
    seeds["overlap.safetensors"] = struct.pack("<Q", len(overlap)) + overlap + b"abcdef"
    seeds["truncated_data.safetensors"] = dtypes[:-5]
    seeds["truncated_header.safetensors"] = dtypes[:100]
    seeds["short.safetensors"] = dtypes[:6]
    return seeds


# ------------------------------------------------------------------ IDX

def idx(shape, data, dtype=0x08):
    return bytes([0, 0, dtype, len(shape)]) + b"".join(struct.pack(">I", d) for d in shape) + data


def idx_seeds():
    seeds = {
        "small-idx2": idx([2, 3], bytes(range(1, 7))),
        "labels-idx1": idx([5], bytes([9, 0, 0, 3, 2])),
        "empty-idx2": idx([0, 28], b""),
        "cube-idx3": idx([2, 2, 2], bytes(range(8))),
        "float-idx1": idx([2], b"\0" * 8, dtype=0x0D),  # refused: not unsigned bytes
    }
    seeds["small-idx2.gz"] = gzip_bytes(seeds["small-idx2"])
    seeds["truncated-idx2"] = seeds["small-idx2"][:-1]
    seeds["trailing-idx2"] = seeds["small-idx2"] + b"\x09"
    seeds["truncated-idx2.gz"] = gzip_bytes(seeds["small-idx2"][:-1])
    images = FASHION / "t10k-images-idx3-ubyte.gz"
    labels = FASHION / "t10k-labels-idx1-ubyte.gz"
    if images.exists() and labels.exists():  # Debian's dataset-fashion-mnist: the first records
        with gzip.open(images) as f:
            head = f.read(16 + 2 * 784)
        seeds["fashion-images-idx3"] = idx([2, 28, 28], head[16:])
        seeds["fashion-images-idx3.gz"] = gzip_bytes(seeds["fashion-images-idx3"])
        with gzip.open(labels) as f:
            head = f.read(8 + 16)
        seeds["fashion-labels-idx1.gz"] = gzip_bytes(idx([16], head[8:]))
    return seeds


# ------------------------------------------------------------------ CIFAR-10

def cifar_seeds():
    record = lambda label, base: bytes([label]) + bytes((base + i) % 256 for i in range(3072))
    return {
        "one_record.bin": record(3, 0),
        "two_records.bin": record(0, 7) + record(9, 100),
        "bad_label.bin": record(10, 0),
        "truncated.bin": record(1, 0)[:3000],
    }


# ------------------------------------------------------------------ images

def png(width, height, color_type, bit_depth, rows, palette=None):
    """rows: the filtered scanlines' raw bytes without the filter byte (filter 0 each)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\0" + row for row in rows)
    out = b"\x89PNG\r\n\x1a\n" + chunk(
        b"IHDR", struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0))
    if palette:
        out += chunk(b"PLTE", palette)
    return out + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def gif(width, height, pixels, palette):
    """An uncompressed GIF: LZW with a clear code before every code table could grow."""
    min_code = 7
    clear, end = 1 << min_code, (1 << min_code) + 1
    codes, run = [clear], 0
    for p in pixels:
        if run == (1 << min_code) - 2:
            codes.append(clear)
            run = 0
        codes.append(p)
        run += 1
    codes.append(end)
    bits, nbits, data = 0, 0, bytearray()
    for c in codes:  # 8-bit codes (min_code + 1), least significant bit first
        bits |= c << nbits
        nbits += min_code + 1
        while nbits >= 8:
            data.append(bits & 0xFF)
            bits >>= 8
            nbits -= 8
    if nbits:
        data.append(bits & 0xFF)
    blocks = b"".join(bytes([len(data[i:i + 255])]) + data[i:i + 255]
                      for i in range(0, len(data), 255)) + b"\0"
    table = palette.ljust(3 * 128, b"\0")
    return (b"GIF89a" + struct.pack("<HHBBB", width, height, 0xF6, 0, 0) + table +
            b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0) + bytes([min_code]) +
            blocks + b"\x3b")


STB_WRITER = r"""
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>
#include <stdio.h>
int main(int argc, char** argv) {
  unsigned char rgb[8 * 6 * 3], grey[5 * 4];
  for (int i = 0; i < 8 * 6 * 3; ++i) rgb[i] = (unsigned char)(i * 37 % 251);
  for (int i = 0; i < 5 * 4; ++i) grey[i] = (unsigned char)(i * 13);
  char path[4096];
#define OUT(name) (snprintf(path, sizeof path, "%s/%s", argv[1], name), path)
  stbi_write_jpg(OUT("rgb.jpg"), 8, 6, 3, rgb, 90);
  stbi_write_jpg(OUT("grey.jpg"), 5, 4, 1, grey, 75);
  stbi_write_bmp(OUT("rgb.bmp"), 8, 6, 3, rgb);
  stbi_write_bmp(OUT("rgba.bmp"), 4, 3, 4, rgb);
  stbi_write_tga(OUT("rle.tga"), 8, 6, 3, rgb);
  stbi_write_tga_with_rle = 0;
  stbi_write_tga(OUT("grey.tga"), 5, 4, 1, grey);
  return argc == 2 ? 0 : 1;
}
"""


def stb_written():
    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp) / "writer.c"
        source.write_text(STB_WRITER)
        subprocess.run(["cc", "-O1", "-o", f"{tmp}/writer", str(source), "-lm"], check=True)
        subprocess.run([f"{tmp}/writer", tmp], check=True)
        return {p.name: p.read_bytes() for p in sorted(pathlib.Path(tmp).iterdir())
                if p.suffix in (".jpg", ".bmp", ".tga")}


def image_seeds():
    w, h = 4, 3
    seeds = {
        "rgb8.png": png(w, h, 2, 8, [bytes((x * 60 + y * 20 + c * 5) % 256
                                           for x in range(w) for c in range(3)) for y in range(h)]),
        "rgba8.png": png(w, h, 6, 8, [bytes(range(y * 16, y * 16 + 16)) for y in range(h)]),
        "grey8.png": png(w, h, 0, 8, [bytes([y * 40 + x for x in range(w)]) for y in range(h)]),
        "greyalpha8.png": png(w, h, 4, 8, [bytes(range(8)) for _ in range(h)]),
        "grey16.png": png(w, h, 0, 16, [struct.pack(">4H", 0, 1000, 40000, 65535)] * h),
        "rgb16.png": png(2, 2, 2, 16, [b"\x12\x34" * 6] * 2),
        "grey1.png": png(8, 2, 0, 1, [b"\xa5", b"\x5a"]),
        "palette8.png": png(w, h, 3, 8, [bytes([0, 1, 2, 1])] * h, b"\xff\0\0\0\xff\0\0\0\xff"),
        "palette4.png": png(w, h, 3, 4, [b"\x01\x20"] * h, b"\xff\0\0\0\xff\0\0\0\xff"),
        "grey.pgm": b"P5\n# a comment\n4 3\n255\n" + bytes(range(12)),
        "rgb.ppm": b"P6 2 2 255 " + bytes(range(12)),
        "rgb16.ppm": b"P6\n1 1\n65535\n" + b"\x01\x02\x03\x04\x05\x06",
        "palette.gif": gif(4, 3, [0, 1, 2, 3] * 3, b"\0\0\0\xff\xff\xff\xff\0\0\0\xff\0"),
        "one_pixel.gif": bytes.fromhex("47494638396101000100800000ffffff00000021f90401000000"
                                       "002c00000000010001000002024401003b"),
    }
    seeds.update(stb_written())
    seeds["truncated.png"] = seeds["rgb8.png"][:40]
    seeds["truncated.jpg"] = seeds["rgb.jpg"][: len(seeds["rgb.jpg"]) // 2]
    seeds["bad_crc.png"] = seeds["grey8.png"][:29] + b"\0\0\0\0" + seeds["grey8.png"][33:]
    return seeds


# ------------------------------------------------------------------ text and tokenizers

def text_seeds():
    fortune = pathlib.Path("/usr/share/games/fortunes/fortunes")
    english = fortune.read_bytes()[:2048] if fortune.exists() else b"To be or not to be.\n" * 50
    return {
        "english.txt": english,
        "shakespeare.txt": b"First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
                           b"All:\nSpeak, speak.\n",
        "utf8.txt": "naïve café — Ελληνικά, 日本語, emoji 🙂👍🏽\n".encode(),
        "binary.bin": bytes(range(256)),
        "one_byte.txt": b"a",
        "two_bytes.txt": b"ab",
    }


def byte_char(b):
    """GPT-2's bytes_to_unicode: the character that stands for byte b."""
    printable = lambda x: ord("!") <= x <= ord("~") or 0xA1 <= x <= 0xAC or 0xAE <= x <= 0xFF
    if printable(b):
        return chr(b)
    return chr(256 + sum(1 for x in range(b) if not printable(x)))


def bpe_files_seeds():
    separator = b"\n--merges.txt--\n"
    vocab = {byte_char(b): b for b in range(256)}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"),
              ("o", "n"), ("Ġ", "s"), ("r", "e"), ("a", "n")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    vocab_json = json.dumps(vocab, ensure_ascii=False, separators=(",", ":")).encode()
    merges_txt = ("#version: 0.2\n" + "".join(f"{l} {r}\n" for l, r in merges)).encode()
    seeds = {
        "small": vocab_json + separator + merges_txt,
        "no_merges": vocab_json,
        "crlf": vocab_json + separator + merges_txt.replace(b"\n", b"\r\n"),
        "escaped": json.dumps(vocab, ensure_ascii=True).encode() + separator + merges_txt,
        "missing_token": vocab_json + separator + merges_txt + b"x y\n",
        "duplicate_merge": vocab_json + separator + merges_txt + b"h e\n",
        "bad_id": vocab_json.replace(b':0,', b':-1,', 1) + separator + merges_txt,
        "not_object": b"[1, 2, 3]" + separator + merges_txt,
        "truncated": vocab_json[: len(vocab_json) // 2],
    }
    return seeds


def bpe_encode_seeds():
    cases = json.loads((GOLDEN / "bpe" / "cases.json").read_text())["cases"]
    seeds = {}
    for i, case in enumerate(cases):
        text = case["text"].encode()
        if 0 < len(text) <= 2048:
            seeds[f"case{i:02d}.txt"] = text
    seeds["not_utf8.bin"] = b"abc \xff\xfe \xc3\x28 \xe2\x82 \xf0\x9f\x98 end<|endoftext|>x"
    seeds["surrogate.bin"] = b"\xed\xa0\x80 it's \xf4\x90\x80\x80"
    return seeds


def main():
    write_corpus("safetensors", safetensors_seeds())
    write_corpus("idx", idx_seeds())
    write_corpus("cifar10", cifar_seeds())
    write_corpus("image", image_seeds())
    write_corpus("text", text_seeds())
    write_corpus("bpe_files", bpe_files_seeds())
    write_corpus("bpe_encode", bpe_encode_seeds())


if __name__ == "__main__":
    main()
