"""`face_detect`: image bytes in; face boxes, scores and landmarks out (a Triton Python
model running MTCNN's cascade).

One request carries one encoded image (`image`, BYTES [1]). The cascade's steps are in
face_steps.py beside this file; its three networks are separate models called through
BLS, each through its own scheduler in the server:

    decode -> P-Net per pyramid level -> NMS -> R-Net on all candidates -> NMS
           -> O-Net on the survivors -> landmarks, NMS

BLS rather than an ensemble, because the cascade's shape depends on the data: the number
of pyramid levels on the image's size, the number of candidates on what P-Net found, and
an image where a stage finds nothing skips the rest. P-Net's input size changes with every
level (a shape range on GE); R-Net and O-Net take all of a request's candidates in one
batch (batch gears), and with `dynamic_batching` concurrent requests share executions.

Outputs: `boxes` FP32 [N, 4] (x1, y1, x2, y2 in pixels), `scores` FP32 [N] and
`landmarks` FP32 [N, 5, 2] (x, y of the left eye, right eye, nose, left and right mouth
corners, as seen in the image).
"""

import json
from typing import Any

import face_steps
import numpy as np
import triton_python_backend_utils as pb_utils

OUTPUTS = {"pnet": ("reg", "prob"), "rnet": ("reg", "prob"), "onet": ("reg", "landmarks", "prob")}


def _param(config: dict[str, Any], key: str, default: str) -> str:
    found = config.get("parameters", {}).get(key)
    return str(found["string_value"]) if found else default


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.models = {
            stage: _param(config, f"{stage}_model", f"mtcnn_{stage}") for stage in OUTPUTS
        }
        self.max_batch = (
            int(_param(config, "rnet_max_batch", "64")),
            int(_param(config, "onet_max_batch", "32")),
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except face_steps.BadImage as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
        return responses

    def _one(self, request: Any) -> Any:
        images = pb_utils.get_input_tensor_by_name(request, "image").as_numpy().reshape(-1)
        if images.size != 1:
            raise face_steps.BadImage(f"send one image per request, not {images.size}")
        image = face_steps.decode_image(bytes(images[0]))
        faces = face_steps.detect(image, self._call, self.max_batch)
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("boxes", faces.boxes.reshape(-1, 4)),
                pb_utils.Tensor("scores", faces.scores.reshape(-1)),
                pb_utils.Tensor("landmarks", faces.landmarks.reshape(-1, 5, 2)),
            ]
        )

    def _call(self, stage: str, batch: Any) -> dict[str, Any]:
        model = self.models[stage]
        call = pb_utils.InferenceRequest(
            model_name=model,
            inputs=[pb_utils.Tensor("x", np.ascontiguousarray(batch, np.float32))],
            requested_output_names=list(OUTPUTS[stage]),
        )
        response = call.exec()
        if response.has_error():
            raise pb_utils.TritonModelException(f"{model}: {response.error().message()}")
        return {
            name: pb_utils.get_output_tensor_by_name(response, name).as_numpy()
            for name in OUTPUTS[stage]
        }
