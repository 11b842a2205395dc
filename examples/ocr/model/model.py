"""`ocr`: image bytes in; text boxes, their text and scores out (a Triton Python model).

One request carries one encoded image (`image`, BYTES [1]). The model decodes it and
calls the three PP-OCRv4 models through BLS, each through its own scheduler and batcher
in the server, so that the detector's, classifier's and recogniser's calls from
concurrent requests are batched together:

    decode -> ocr_det -> DB boxes -> crops -> ocr_cls -> turn -> ocr_rec per width -> CTC

BLS rather than an ensemble, because the pipeline's shape depends on the data: the number
of boxes is known only after detection, an image with no text skips the other two
models, and the recogniser is called once per width bucket of the lines found.

Outputs: `boxes` FP32 [N, 4, 2] (x, y in the image, clockwise from top-left, in reading
order), `text` BYTES [N] (UTF-8) and `scores` FP32 [N] (the recogniser's mean character
probability); lines scoring under `text_score` are left out. The pre- and post-processing
lives in ocr_steps.py beside this file; the character dictionary in ppocr_keys.txt.
"""

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import ocr_steps
import triton_python_backend_utils as pb_utils
from PIL import Image


def _param(config: dict[str, Any], key: str, default: str) -> str:
    found = config.get("parameters", {}).get(key)
    return str(found["string_value"]) if found else default


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.det_model = _param(config, "det_model", "ocr_det")
        self.cls_model = _param(config, "cls_model", "ocr_cls")
        self.rec_model = _param(config, "rec_model", "ocr_rec")
        self.use_cls = _param(config, "use_cls", "true").lower() == "true"
        self.text_score = float(_param(config, "text_score", "0.5"))
        self.max_rec_batch = int(_param(config, "max_rec_batch", "16"))
        # The classifier's max_batch_size: a page has more lines than one call may carry.
        self.max_cls_batch = int(_param(config, "max_cls_batch", "32"))
        self.det = ocr_steps.DetSettings(
            thresh=float(_param(config, "det_thresh", "0.3")),
            box_thresh=float(_param(config, "det_box_thresh", "0.5")),
            unclip_ratio=float(_param(config, "det_unclip_ratio", "1.6")),
        )
        keys = Path(__file__).with_name("ppocr_keys.txt").read_text(encoding="utf-8")
        self.characters = ocr_steps.characters_from(keys)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except ocr_steps.BadImage as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
        return responses

    def _one(self, request: Any) -> Any:
        images = pb_utils.get_input_tensor_by_name(request, "image").as_numpy().reshape(-1)
        if images.size != 1:
            raise ocr_steps.BadImage(f"send one image per request, not {images.size}")
        rgb = ocr_steps.decode_image(bytes(images[0]))
        prob = self._call(self.det_model, ocr_steps.det_input(rgb), "maps")[0, 0]
        boxes, _ = ocr_steps.text_boxes(prob, (rgb.shape[0], rgb.shape[1]), self.det)
        boxes = boxes[ocr_steps.reading_order(boxes)]
        if len(boxes) == 0:
            return self._response(boxes, [])
        image = Image.fromarray(rgb)
        crops = [ocr_steps.crop(image, box) for box in boxes]
        if self.use_cls:
            step = self.max_cls_batch
            probs = np.concatenate(
                [
                    self._call(self.cls_model, ocr_steps.cls_input(crops[i : i + step]), "probs")
                    for i in range(0, len(crops), step)
                ]
            )
            crops = ocr_steps.upright(crops, probs)
        lines: list[tuple[str, float]] = [("", 0.0)] * len(crops)
        for indices, tensor in ocr_steps.rec_batches(crops):
            for start in range(0, len(indices), self.max_rec_batch):
                part = slice(start, start + self.max_rec_batch)
                probs = self._call(self.rec_model, tensor[part], "probs")
                for index, line in zip(
                    indices[part], ocr_steps.ctc_decode(probs, self.characters), strict=True
                ):
                    lines[index] = line
        keep = [i for i, (text, score) in enumerate(lines) if text and score >= self.text_score]
        return self._response(boxes[keep], [lines[i] for i in keep])

    def _call(self, model: str, array: npt.NDArray[Any], output: str) -> npt.NDArray[Any]:
        request = pb_utils.InferenceRequest(
            model_name=model,
            inputs=[pb_utils.Tensor("x", np.ascontiguousarray(array, np.float32))],
            requested_output_names=[output],
        )
        response = request.exec()
        if response.has_error():
            raise pb_utils.TritonModelException(f"{model}: {response.error().message()}")
        found: npt.NDArray[Any] = pb_utils.get_output_tensor_by_name(response, output).as_numpy()
        return found

    def _response(self, boxes: npt.NDArray[np.float32], lines: list[tuple[str, float]]) -> Any:
        text = np.array([t.encode("utf-8") for t, _ in lines], dtype=np.object_)
        scores = np.array([s for _, s in lines], dtype=np.float32)
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("boxes", boxes.astype(np.float32).reshape(-1, 4, 2)),
                pb_utils.Tensor("text", text.reshape(-1)),
                pb_utils.Tensor("scores", scores.reshape(-1)),
            ]
        )
