"""`efficientnet`: image bytes in; the top-k ImageNet labels and their scores out (a
Triton Python model).

One request carries one encoded image (`image`, BYTES [1]). The model decodes it, resizes
and crops it (classify_steps.py beside this file) and calls the EfficientNet-Lite0 ONNX
model (`classifier_model`, by default `efficientnet_lite0`) through BLS. That call goes
through the classifier's own scheduler, so with `dynamic_batching` there the images of
concurrent requests run as one batch gear on the device.

Outputs: `labels` BYTES [k] (the class names, best first, from labels.txt), `scores`
FP32 [k] (softmax probabilities) and `classes` INT32 [k] (ImageNet class indices). k is
the config's `top_k` parameter (default 5); a request may ask for fewer or more with a
`top_k` request parameter.
"""

import json
from pathlib import Path
from typing import Any

import classify_steps
import numpy as np
import triton_python_backend_utils as pb_utils


def _param(config: dict[str, Any], key: str, default: str) -> str:
    found = config.get("parameters", {}).get(key)
    return str(found["string_value"]) if found else default


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.classifier = _param(config, "classifier_model", "efficientnet_lite0")
        self.top_k = int(_param(config, "top_k", "5"))
        labels = Path(__file__).with_name("labels.txt").read_text(encoding="utf-8")
        self.labels = classify_steps.read_labels(labels)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except classify_steps.BadImage as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
        return responses

    def _k(self, request: Any) -> int:
        asked = json.loads(request.parameters() or "{}").get("top_k", self.top_k)
        if isinstance(asked, bool) or not isinstance(asked, int) or not 1 <= asked <= 1000:
            raise classify_steps.BadImage(f"top_k must be an integer from 1 to 1000, not {asked!r}")
        return asked

    def _one(self, request: Any) -> Any:
        k = self._k(request)
        images = pb_utils.get_input_tensor_by_name(request, "image").as_numpy().reshape(-1)
        if images.size != 1:
            raise classify_steps.BadImage(f"send one image per request, not {images.size}")
        tensor = classify_steps.model_input(classify_steps.decode_image(bytes(images[0])))
        call = pb_utils.InferenceRequest(
            model_name=self.classifier,
            inputs=[pb_utils.Tensor("x", tensor[None])],
            requested_output_names=["logits"],
        )
        response = call.exec()
        if response.has_error():
            raise pb_utils.TritonModelException(f"{self.classifier}: {response.error().message()}")
        logits = pb_utils.get_output_tensor_by_name(response, "logits").as_numpy()[0]
        classes, scores = classify_steps.top_k(logits, k)
        labels = np.array([self.labels[i].encode("utf-8") for i in classes], dtype=np.object_)
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("labels", labels),
                pb_utils.Tensor("scores", scores),
                pb_utils.Tensor("classes", classes.astype(np.int32)),
            ]
        )
