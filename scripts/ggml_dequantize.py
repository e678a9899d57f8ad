#!/usr/bin/env python3
"""ggml's own dequantization of GGUF files, for the exactness tests: digests, and f32 copies to run llama.cpp on.

Each quantized tensor's stored bytes (gguf-py's reader) go through the to_float of ggml's type traits
(libggml-base from LLAMA_CPP_LIB_PATH, the llama.cpp build the fixtures are made with: ggml's reference
dequantize_row_*). Writes
  DIGESTS.json      {NAME: {tensor: {"type": ggml type name, "sha256": hex of the little-endian f32 values}}}:
                    lowbit's dequantization is bit-identical exactly when its f32 bytes hash the same;
  F32_DIR/NAME.gguf the same model with every quantized tensor replaced by those f32 values (metadata copied), so
                    llama.cpp's logits on exactly the weights lowbit computes with can be taken (no activation
                    rounding: llama.cpp only rounds activations for quantized weights).

usage: ggml_dequantize.py DIGESTS.json F32_DIR NAME=MODEL.gguf...   (PYTHONPATH must reach llama.cpp's gguf-py)
"""
import ctypes
import hashlib
import json
import os
import sys

import numpy as np
import gguf


class TypeTraits(ctypes.Structure):  # struct ggml_type_traits (ggml.h)
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p), ("from_float_ref", ctypes.c_void_p)]


ToFloat = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64)
FLOAT_TYPES = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16}


def dequantized(ggml: ctypes.CDLL, t) -> np.ndarray:
    """The tensor's f32 values by ggml's to_float, in GGUF order (row-major with ne reversed)."""
    if t.tensor_type in FLOAT_TYPES:
        return np.asarray(t.data, dtype=np.float32).reshape(-1)
    to_float = ToFloat(ggml.ggml_get_type_traits(int(t.tensor_type)).contents.to_float)
    raw = np.ascontiguousarray(t.data).view(np.uint8)
    values = np.empty(int(t.n_elements), dtype="<f4")
    to_float(raw.ctypes.data, values.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), values.size)
    return values


def write_f32_copy(reader: gguf.GGUFReader, tensors: dict, path: str) -> None:
    writer = gguf.GGUFWriter(path, reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.alignment"):
            continue  # written by GGUFWriter itself
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type)
    for t in reader.tensors:
        writer.add_tensor(t.name, tensors[t.name].reshape(tuple(reversed([int(n) for n in t.shape]))))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> int:
    out, f32_dir, *models = sys.argv[1:]
    ggml = ctypes.CDLL(os.path.join(os.environ["LLAMA_CPP_LIB_PATH"], "libggml-base.so"))
    ggml.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    ggml.ggml_get_type_traits.argtypes = [ctypes.c_int]
    result = {}
    for spec in models:
        name, path = spec.split("=", 1)
        reader = gguf.GGUFReader(path)
        tensors, digests = {}, {}
        for t in reader.tensors:
            tensors[t.name] = dequantized(ggml, t)
            if t.tensor_type not in FLOAT_TYPES:
                digests[t.name] = {"type": t.tensor_type.name,
                                   "sha256": hashlib.sha256(tensors[t.name].tobytes()).hexdigest()}
        result[name] = digests
        write_f32_copy(reader, tensors, os.path.join(f32_dir, f"{name}.gguf"))
    with open(out, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
