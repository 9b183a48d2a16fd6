"""Regenerate the gRPC code in `headroom/protocol/generated/` (no make needed).

    python -m headroom.protocol.gen_grpc           # protoc: proto/*.proto -> generated/*_pb2*.py[i]
    python -m headroom.protocol.gen_grpc --derive  # first re-derive proto/*.proto from tritonclient

Why derive: `tritonclient.grpc` is the reference client, so our wire format must match its `.proto` byte for
byte (package `inference`, every message, field name and number). tritonclient ships only the compiled
descriptors, so `--derive` prints them back as proto3 text under distinct file names
(`headroom_inference.proto`, `headroom_model_config.proto`).

Why a private descriptor pool: protobuf's default pool refuses a second file that defines `inference.*`
symbols, so the server's generated modules and tritonclient's could not be imported in one process. The
post-processing below points the generated modules at `generated/_pool.py`'s own `DescriptorPool`, makes
their imports package-relative, and marks them exempt from ruff/mypy (the `.pyi` stubs carry the types).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PROTO_DIR = HERE / "proto"
OUT_DIR = HERE / "generated"
#: tritonclient file name -> our file name (distinct paths; the pool is private anyway).
FILE_NAMES = {
    "model_config.proto": "headroom_model_config.proto",
    "grpc_service.proto": "headroom_inference.proto",
}
_SCALARS = {
    1: "double",
    2: "float",
    3: "int64",
    4: "uint64",
    5: "int32",
    6: "fixed64",
    7: "fixed32",
    8: "bool",
    9: "string",
    12: "bytes",
    13: "uint32",
    15: "sfixed32",
    16: "sfixed64",
    17: "sint32",
    18: "sint64",
}
_TYPE_MESSAGE, _TYPE_ENUM, _LABEL_REPEATED = 11, 14, 3


def _type_name(field: Any) -> str:
    ftype = field.type
    if ftype in (_TYPE_MESSAGE, _TYPE_ENUM):
        return str(field.type_name)  # fully qualified, with a leading dot
    return _SCALARS[ftype]


def _message_text(msg: Any, indent: str) -> list[str]:
    lines = [f"{indent}message {msg.name} {{"]
    inner = indent + "  "
    maps = {f"{msg.name}.{n.name}": n for n in msg.nested_type if n.options.map_entry}
    for enum in msg.enum_type:
        lines += _enum_text(enum, inner)
    for nested in msg.nested_type:
        if not nested.options.map_entry:
            lines += _message_text(nested, inner)
    # Declaration order is kept; a oneof block sits where its first member was declared.
    body: list[str | int] = []
    oneofs: dict[int, list[str]] = {}
    for field in msg.field:
        entry = None
        if field.type == _TYPE_MESSAGE:
            entry = next((e for key, e in maps.items() if field.type_name.endswith("." + key)), None)
        if entry is not None:
            key_f, val_f = entry.field[0], entry.field[1]
            text = f"map<{_type_name(key_f)}, {_type_name(val_f)}> {field.name} = {field.number};"
        else:
            label = "repeated " if field.label == _LABEL_REPEATED else ""
            text = f"{label}{_type_name(field)} {field.name} = {field.number};"
        if field.HasField("oneof_index"):
            if field.oneof_index not in oneofs:
                body.append(field.oneof_index)
            oneofs.setdefault(field.oneof_index, []).append(text)
        else:
            body.append(text)
    for item in body:
        if isinstance(item, str):
            lines.append(inner + item)
            continue
        lines.append(f"{inner}oneof {msg.oneof_decl[item].name} {{")
        lines += [f"{inner}  {t}" for t in oneofs[item]]
        lines.append(f"{inner}}}")
    lines.append(f"{indent}}}")
    return lines


def _enum_text(enum: Any, indent: str) -> list[str]:
    lines = [f"{indent}enum {enum.name} {{"]
    lines += [f"{indent}  {v.name} = {v.number};" for v in enum.value]
    return [*lines, f"{indent}}}"]


def derive_proto_text(file_descriptor: Any) -> str:
    """Print a compiled FileDescriptor back as proto3 source (enough for tritonclient's two files)."""
    from google.protobuf import descriptor_pb2

    fdp = descriptor_pb2.FileDescriptorProto()
    file_descriptor.CopyToProto(fdp)
    lines = [
        f"// Derived by headroom/protocol/gen_grpc.py --derive from tritonclient's compiled `{fdp.name}`.",
        "// Field names and numbers are the wire contract with tritonclient: do not edit by hand.",
        'syntax = "proto3";',
        "",
        f"package {fdp.package};",
        "",
    ]
    lines += [f'import "{FILE_NAMES.get(dep, dep)}";' for dep in fdp.dependency]
    for enum in fdp.enum_type:
        lines += ["", *_enum_text(enum, "")]
    for msg in fdp.message_type:
        lines += ["", *_message_text(msg, "")]
    for service in fdp.service:
        lines += ["", f"service {service.name} {{"]
        for m in service.method:
            cin = "stream " if m.client_streaming else ""
            sout = "stream " if m.server_streaming else ""
            lines.append(f"  rpc {m.name}({cin}{m.input_type}) returns ({sout}{m.output_type}) {{}}")
        lines.append("}")
    return "\n".join(lines) + "\n"


def derive(proto_dir: Path = PROTO_DIR) -> None:
    """Write proto/*.proto from tritonclient's compiled descriptors."""
    from tritonclient.grpc import model_config_pb2, service_pb2

    for module in (model_config_pb2, service_pb2):
        target = proto_dir / FILE_NAMES[module.DESCRIPTOR.name]
        target.write_text(derive_proto_text(module.DESCRIPTOR))
        print(f"wrote {target}")


_HEADER = "# ruff: noqa\n# mypy: ignore-errors\n# Generated by headroom/protocol/gen_grpc.py: do not edit.\n"


def _postprocess(path: Path) -> None:
    text = path.read_text()
    stems = [Path(n).stem + "_pb2" for n in FILE_NAMES.values()]
    for stem in stems:
        text = re.sub(rf"^import {stem} as ", f"from . import {stem} as ", text, flags=re.M)
        text = re.sub(rf"^import {stem}$", f"from . import {stem}", text, flags=re.M)
    if path.name.endswith("_pb2.py"):
        text = text.replace("_descriptor_pool.Default()", "_pool.POOL")
        text = text.replace(
            "from google.protobuf import descriptor_pool as _descriptor_pool\n",
            "from google.protobuf import descriptor_pool as _descriptor_pool\nfrom . import _pool\n",
        )
    text = _HEADER + text
    path.write_text(text)


def generate(proto_dir: Path = PROTO_DIR, out_dir: Path = OUT_DIR) -> None:
    """Run grpcio-tools' protoc on proto_dir/*.proto into out_dir, then post-process (see the module doc)."""
    protos = sorted(str(p.name) for p in proto_dir.glob("*.proto"))
    cmd = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        *protos,
    ]
    subprocess.run(cmd, check=True)
    for path in sorted(out_dir.glob("headroom_*")):
        _postprocess(path)
        print(f"generated {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--derive", action="store_true", help="re-derive proto/*.proto from tritonclient's descriptors first"
    )
    args = parser.parse_args(argv)
    if args.derive:
        derive()
    generate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
