"""Strict validation of KEDA objects against KEDA's CRD schema.

`cloudcoil-models-keda` ships pydantic models generated from KEDA's CRDs (keda.sh/v1alpha1). The models check
types, enums and required fields but accept unknown keys; `validate_strictly` also refuses any key that the
schema does not define, at every depth (a misspelt `minReplicaCont` is an error, as `kubectl --validate=strict`
makes it for a CRD with a structural schema)."""

from __future__ import annotations

import typing
from typing import Any

from cloudcoil.models.keda import v1alpha1
from pydantic import BaseModel


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _unknown_keys(model: type[BaseModel], value: Any, path: str) -> list[str]:
    if isinstance(value, list):
        return [e for i, v in enumerate(value) for e in _unknown_keys(model, v, f"{path}[{i}]")]
    if not isinstance(value, dict):
        return []
    fields = {(f.alias or name): f for name, f in model.model_fields.items()}
    errors = [f"{path}.{key}: not in the schema" for key in value if key not in fields]
    for key, sub in value.items():
        if key in fields:
            for inner in _models_in(fields[key].annotation):
                errors += _unknown_keys(inner, sub, f"{path}.{key}")
    return errors


def validate_strictly(doc: dict[str, Any]) -> None:
    """Raise ValueError unless `doc` is a valid KEDA object with no key outside the schema."""
    kinds: dict[str, type[BaseModel]] = {"ScaledObject": v1alpha1.ScaledObject,
                                         "TriggerAuthentication": v1alpha1.TriggerAuthentication}
    kind = doc.get("kind")
    if doc.get("apiVersion") != "keda.sh/v1alpha1" or kind not in kinds:
        raise ValueError(f"not a keda.sh/v1alpha1 object this checker knows: {doc.get('apiVersion')} {kind}")
    kinds[kind].model_validate(doc)  # types, enums, required fields
    errors = _unknown_keys(kinds[kind], doc, str(kind))
    if errors:
        raise ValueError("; ".join(errors))


