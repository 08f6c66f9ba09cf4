// Decoding realtime frame batches (realtime-video.md §5) into drawable frames:
// raw RGB24 -> ImageData; jpeg/webp -> ImageBitmap; delta-gzip -> gunzip (DecompressionStream)
// + cumulative XOR against the previous frame. delta-zstd has no browser decoder: not offered.

import { PlaygroundError } from "./errors.js";

function rgbToImageData(rgb, width, height) {
  const image = new ImageData(width, height);
  const out = image.data;
  for (let src = 0, dst = 0; src < rgb.length; src += 3, dst += 4) {
    out[dst] = rgb[src];
    out[dst + 1] = rgb[src + 1];
    out[dst + 2] = rgb[src + 2];
    out[dst + 3] = 255;
  }
  return image;
}

async function gunzip(bytes) {
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

function badBatch(message) {
  return new PlaygroundError("realtime", { code: "bad_batch", message });
}

/** Keeps the last decoded raw frame, which the next delta batch may reference. */
export class BatchDecoder {
  constructor() {
    this.reference = null; // Uint8Array of the last decoded RGB frame
  }

  reset() { this.reference = null; }

  /** Header + payload -> list of {image (ImageData|ImageBitmap), width, height}. */
  async decode(header, payload) {
    switch (header.encoding) {
      case "raw": return this.raw(header, payload);
      case "jpeg":
      case "webp": return this.encoded(header, payload);
      case "delta-gzip": return this.delta(header, await gunzip(payload));
      default: throw badBatch(`encoding '${header.encoding}' cannot be shown in the browser`);
    }
  }

  frameSize(header) {
    return header.bytes_per_frame || header.width * header.height * 3;
  }

  raw(header, payload) {
    const size = this.frameSize(header);
    if (payload.length !== size * header.num_frames) throw badBatch(`raw payload has ${payload.length} bytes, expected ${size * header.num_frames}`);
    const frames = [];
    for (let i = 0; i < header.num_frames; i++) {
      const rgb = payload.subarray(i * size, (i + 1) * size);
      frames.push({ image: rgbToImageData(rgb, header.width, header.height), width: header.width, height: header.height });
    }
    this.reference = payload.slice((header.num_frames - 1) * size);
    return frames;
  }

  async encoded(header, payload) {
    const type = header.encoding === "jpeg" ? "image/jpeg" : "image/webp";
    const lengths = header.payload_lengths || [payload.length];
    const frames = [];
    let offset = 0;
    for (const length of lengths) {
      const blob = new Blob([payload.subarray(offset, offset + length)], { type });
      offset += length;
      const image = await createImageBitmap(blob);
      frames.push({ image, width: image.width, height: image.height });
    }
    this.reference = null; // previews break any delta chain
    return frames;
  }

  delta(header, raw) {
    const size = this.frameSize(header);
    if (raw.length !== size * header.num_frames) throw badBatch("delta payload has the wrong size");
    if (header.delta_reference) {
      if (!this.reference || this.reference.length !== size) {
        return []; // a batch was missed: wait for one without a reference (contract §5.2)
      }
      for (let j = 0; j < size; j++) raw[j] ^= this.reference[j];
    }
    for (let i = 1; i < header.num_frames; i++) {
      const cur = i * size, prev = cur - size;
      for (let j = 0; j < size; j++) raw[cur + j] ^= raw[prev + j];
    }
    return this.raw({ ...header, encoding: "raw" }, raw);
  }
}
