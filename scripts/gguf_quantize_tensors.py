#!/usr/bin/env python3
"""Copies a GGUF file with the tensors whose names match REGEX quantized to TYPE by gguf-py's reference quantizer
(from F32, F16 or BF16; metadata and every other tensor unchanged). Makes test fixtures of types and tensor kinds llama-quantize's
recipes leave out, e.g. quantized merged MoE expert tensors of a tiny model.

usage: gguf_quantize_tensors.py IN.gguf OUT.gguf TYPE REGEX     (TYPE: Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0)
"""
import re
import sys

import gguf
import numpy as np


def as_f32(t) -> np.ndarray:
    if t.tensor_type.name == "BF16":  # gguf-py reads bf16 as raw 16-bit words
        return (np.asarray(t.data).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(t.data, dtype=np.float32)


def main() -> int:
    src, dst, type_name, pattern = sys.argv[1:]
    qtype = gguf.GGMLQuantizationType[type_name]
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), field.types[0], sub_type=sub)
    for t in reader.tensors:
        if re.fullmatch(pattern, t.name) and t.tensor_type.name in ("F32", "F16", "BF16"):
            writer.add_tensor(t.name, gguf.quants.quantize(as_f32(t), qtype), raw_dtype=qtype)
            print(f"{t.name}: {t.tensor_type.name} -> {type_name}", file=sys.stderr)
        else:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
