"""The checked-in .proto files and generated code are exactly what the generator derives from tritonclient."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2, service_pb2

from headroom.protocol import gen_grpc
from headroom.protocol.generated import headroom_inference_pb2, headroom_model_config_pb2


def _contract(module: object) -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)  # type: ignore[attr-defined]
    proto.ClearField("name")  # our file names differ on purpose
    proto.ClearField("dependency")
    return proto


def test_wire_contract_equals_tritonclients() -> None:
    assert _contract(headroom_inference_pb2) == _contract(service_pb2)
    assert _contract(headroom_model_config_pb2) == _contract(model_config_pb2)


def test_checked_in_protos_are_freshly_derived(tmp_path: Path) -> None:
    gen_grpc.derive(tmp_path)
    for name in gen_grpc.FILE_NAMES.values():
        assert (tmp_path / name).read_text() == (gen_grpc.PROTO_DIR / name).read_text(), name


def test_checked_in_generated_code_is_fresh(tmp_path: Path) -> None:
    gen_grpc.generate(gen_grpc.PROTO_DIR, tmp_path)
    produced = sorted(p.name for p in tmp_path.glob("headroom_*"))
    assert produced == sorted(p.name for p in gen_grpc.OUT_DIR.glob("headroom_*"))
    for name in produced:
        assert (tmp_path / name).read_text() == (gen_grpc.OUT_DIR / name).read_text(), name


def test_generated_modules_use_a_private_pool_so_tritonclient_can_coexist() -> None:
    # tritonclient's modules are imported above; ours registered `inference.*` elsewhere without conflict.
    message = headroom_inference_pb2.ModelInferRequest(model_name="m", id="1")
    assert service_pb2.ModelInferRequest.FromString(message.SerializeToString()).model_name == "m"
