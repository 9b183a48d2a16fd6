"""THE digits transform, shared by training and serving so they cannot drift apart.

Pixel scale: scikit-learn's `load_digits()` images are 8x8, ink bright, intensities 0..16. Serving turns any
PNG/JPEG into that scale (`decode_image`), and both paths then call `to_model_input`, which stretches each
image so its brightest pixel is 16 and standardises with the training set's mean and standard deviation.

    training:  to_model_input(load_digits().images)
    serving:   to_model_input(decode_image(png_bytes)[None])   or   to_model_input(v2_tensor)
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from headroom.core.errors import InvalidRequest

IMAGE_SIDE_PX = 8  # the model sees 8x8 images
PIXEL_MAX = 16.0  # scikit-learn's digits intensity scale is 0..16
PIXEL_MEAN = 4.88  # mean intensity of load_digits().images (0..16 scale)
PIXEL_STD = 6.02  # standard deviation of load_digits().images (0..16 scale)
MAX_IMAGE_SIDE_PX = 4096  # refuse larger images instead of decoding a decompression bomb


def decode_image(data: bytes) -> np.ndarray:
    """PNG/JPEG bytes -> float32 [8, 8] in 0..16, ink bright (dark-on-light images are inverted).

    Raises InvalidRequest when the bytes are not a decodable image.
    """
    try:
        image: Image.Image = Image.open(io.BytesIO(data))
        if max(image.size) > MAX_IMAGE_SIDE_PX:
            raise InvalidRequest(f"image is {image.size[0]}x{image.size[1]} px; at most {MAX_IMAGE_SIDE_PX} per side")
        image = ImageOps.exif_transpose(image)
        if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
            rgba = image.convert("RGBA")
            background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            image = Image.alpha_composite(background, rgba)
        gray = image.convert("L")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InvalidRequest(f"the body is not a PNG or JPEG image the server can decode ({exc})") from None
    pixels = np.asarray(gray, dtype=np.float32)
    if pixels.mean() > 127.5:  # mostly light: dark ink on paper -> make the ink bright like the training data
        gray = ImageOps.invert(gray)
    small = gray.resize((IMAGE_SIDE_PX, IMAGE_SIDE_PX), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float32) * (PIXEL_MAX / 255.0)


def to_model_input(images: np.ndarray) -> np.ndarray:
    """[N, 8, 8] or [N, 1, 8, 8] intensities in 0..16 -> float32 [N, 1, 8, 8] ready for the network."""
    x = np.asarray(images, dtype=np.float32)
    if x.ndim == 4 and x.shape[1] == 1:
        x = x[:, 0]
    if x.ndim != 3 or x.shape[1:] != (IMAGE_SIDE_PX, IMAGE_SIDE_PX):
        raise InvalidRequest(f"digits expects images of shape [N, 1, 8, 8] or [N, 8, 8], got {list(x.shape)}")
    if not np.isfinite(x).all():
        raise InvalidRequest("digits input contains NaN or infinity")
    x = np.clip(x, 0.0, None)
    peak = x.reshape(len(x), -1).max(axis=1) if len(x) else np.zeros(0, np.float32)
    scale = np.where(peak > 0, PIXEL_MAX / np.maximum(peak, 1e-6), 1.0).astype(np.float32)
    x = x * scale[:, None, None]
    return ((x - PIXEL_MEAN) / PIXEL_STD)[:, None, :, :].astype(np.float32)
