// attnlab viewers: what the attention-map page (viewer.js) and the summaries page (summary.js)
// share. attnlab.viz puts this file first in the page's one inline script; the page's own
// script then takes what it needs from `attnlabViz`. Plain JavaScript, no libraries, no network.
const attnlabViz = (function () {
  "use strict";

  const MAX_CANVAS = 32000;  // browsers refuse canvases much taller than 2^15 pixels
  const LABEL_CHARS = 18;    // longer tokens are cut in canvas labels
  const root = document.getElementById("attnlab-viz");

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;  // tokens only ever go in as text
    return node;
  }

  function fail(error) {
    root.dataset.state = "error";
    root.replaceChildren(element("p", "attnlab-error",
                                 "attnlab viewer: " + (error && error.message || error)));
    console.error(error);
  }

  // Reads the JSON block with the id "attnlab-data" and hands it to `start` (which may return
  // a promise); any failure replaces the page with its message instead of leaving it blank.
  function boot(start) {
    try {
      const spec = JSON.parse(document.getElementById("attnlab-data").textContent);
      Promise.resolve().then(() => start(spec)).catch(fail);
    } catch (error) {
      fail(error);
    }
  }

  // ---- embedded arrays (attnlab/viz/html.py: pack) ----------------------------------------

  // The raw bytes of a packed array: base64, then deflate unless "compression" says otherwise.
  async function inflate(packed) {
    const text = atob(packed.data);
    let bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    if (packed.compression === "deflate") {
      if (typeof DecompressionStream === "undefined") {
        throw new Error("this browser lacks DecompressionStream; open the file in a current " +
                        "Chrome, Firefox or Safari");
      }
      const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
      bytes = new Uint8Array(await new Response(stream).arrayBuffer());
    }
    return bytes;
  }

  // The stored integers of a packed array of `count` values, as a typed array over its bytes
  // (little-endian, as html.py writes them and as every browser's typed arrays read them).
  async function integers(packed, count, what) {
    let bytes = await inflate(packed);
    const width = packed.bits / 8;
    if (bytes.byteLength !== count * width) {
      throw new Error(`the embedded ${what} hold ${bytes.byteLength} bytes, not ${count * width}`);
    }
    if (packed.planes && width > 1) {  // each value's bytes back together
      const joined = new Uint8Array(bytes.byteLength);
      for (let j = 0; j < width; j++) {
        for (let i = 0; i < count; i++) joined[i * width + j] = bytes[j * count + i];
      }
      bytes = joined;
    }
    const signed = packed.quantization === "int";
    const Type = {8: signed ? Int8Array : Uint8Array, 16: signed ? Int16Array : Uint16Array,
                  32: signed ? Int32Array : Uint32Array}[packed.bits];
    return new Type(bytes.buffer, bytes.byteOffset, count);
  }

  // The values of a packed array as floats: each of its groups (equal runs) was quantized to
  // its own range, linearly (0 .. its largest value) or logarithmically (0 stays exactly 0;
  // 1 .. top span its smallest to its largest positive value).
  async function floats(packed, count, what) {
    const q = await integers(packed, count, what);
    if (packed.quantization === "int") return Float64Array.from(q);
    const out = new Float32Array(count);
    const top = 2 ** packed.bits - 1;
    if (packed.quantization === "log") {
      const groups = packed.lows.length, size = count / groups;
      for (let g = 0; g < groups; g++) {
        const low = Math.log(packed.lows[g]);
        const step = top > 1 ? (Math.log(packed.highs[g]) - low) / (top - 1) : 0;
        for (let i = g * size; i < (g + 1) * size; i++) {
          out[i] = q[i] === 0 ? 0 : Math.exp(low + (q[i] - 1) * step);
        }
      }
      return out;
    }
    const groups = packed.scales.length, size = count / groups;
    for (let g = 0; g < groups; g++) {
      const unit = packed.scales[g] / top;
      for (let i = g * size; i < (g + 1) * size; i++) out[i] = q[i] * unit;
    }
    return out;
  }

  // ---- tokens and colours -------------------------------------------------------------

  function clip(token, length) {
    const most = length || LABEL_CHARS;
    return token.length > most ? token.slice(0, most - 1) + "…" : token;
  }

  // A token as shown: on one line (line breaks, tabs and other control characters become
  // visible symbols), and visible when empty (∅) or all spaces (␣).
  const SYMBOLS = {"\n": "↵", "\t": "⇥", "\r": "␍", "\u2028": "␤", "\u2029": "␤",
                   "\u0085": "␤", "\x7f": "␡"};
  function shown(token) {
    if (token === "") return "∅";
    const line = token.replace(/[\x00-\x1f\x7f\x85\u2028\u2029]/g, (c) =>
      SYMBOLS[c] || String.fromCharCode(0x2400 + c.charCodeAt(0)));
    return token.trim() === "" ? line.replace(/\s/g, "␣") : line;
  }

  function rgb(hex) {
    return [parseInt(hex.slice(1, 3), 16), parseInt(hex.slice(3, 5), 16),
            parseInt(hex.slice(5, 7), 16)];
  }

  const palette = [];  // the colour map as [r, g, b] × 256
  function setPalette(hex) {  // 256 colours as one string of rrggbb
    palette.length = 0;
    for (let i = 0; i < hex.length; i += 6) palette.push(rgb("#" + hex.slice(i, i + 6)));
  }
  function colour(t) {  // t in [0, 1]
    return palette[Math.max(0, Math.min(255, Math.round(t * 255)))];
  }

  // Value → [0, 1] for colouring: linear over [0, max], or logarithmic over [min, max] of the
  // positive values, where 0 has no colour (NaN: drawn blank).
  function linearScale(max) {
    const factor = max > 0 ? 1 / max : 0;
    return (v) => v * factor;
  }
  function logScale(min, max) {
    const low = Math.log(min), span = max > min ? Math.log(max) - low : 1;
    return (v) => v > 0 ? (Math.log(v) - low) / span : NaN;
  }

  // ---- canvases -----------------------------------------------------------------------

  function sizeCanvas(canvas, width, height) {
    const ratio = Math.min(window.devicePixelRatio || 1, MAX_CANVAS / Math.max(width, height));
    canvas.width = Math.max(1, Math.round(width * ratio));
    canvas.height = Math.max(1, Math.round(height * ratio));
    canvas.style.width = width + "px";
    canvas.style.height = height + "px";
    const context = canvas.getContext("2d");
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    return context;
  }

  // A [rows, cols] map as an image, one pixel per cell, coloured by scale(value) in [0, 1]
  // (blank white where it is NaN).
  function mapImage(map, rows, cols, scale) {
    const image = document.createElement("canvas");
    image.width = cols;
    image.height = rows;
    const context = image.getContext("2d");
    const pixels = context.createImageData(cols, rows);
    for (let i = 0; i < rows * cols; i++) {
      const t = scale(map[i]);
      const c = Number.isNaN(t) ? [255, 255, 255] : colour(t);
      pixels.data[4 * i] = c[0];
      pixels.data[4 * i + 1] = c[1];
      pixels.data[4 * i + 2] = c[2];
      pixels.data[4 * i + 3] = 255;
    }
    context.putImageData(pixels, 0, 0);
    return image;
  }

  function colourBar(low, high) {  // the two ends' labels
    const bar = element("div", "attnlab-colourbar");
    bar.append(element("span", null, low));
    const canvas = element("canvas");
    const context = sizeCanvas(canvas, 160, 10);
    for (let x = 0; x < 160; x++) {
      const c = colour(x / 159);
      context.fillStyle = `rgb(${c[0]},${c[1]},${c[2]})`;
      context.fillRect(x, 0, 1, 10);
    }
    bar.append(canvas, element("span", null, high));
    return bar;
  }

  // ---- controls and page --------------------------------------------------------------

  function select(label, options, onChange) {
    const wrap = element("label", "attnlab-control");
    wrap.append(element("span", null, label));
    const box = element("select");
    for (const [value, text] of options) {
      const option = element("option", null, text);
      option.value = String(value);
      box.append(option);
    }
    box.addEventListener("change", () => onChange(Number(box.value)));
    wrap.append(box);
    return {wrap: wrap, box: box};
  }

  // Inside a notebook the page lives in an iframe: tell the notebook how tall it is.
  function reportHeight() {
    if (window.parent === window) return;
    const bottom = root.getBoundingClientRect().bottom + window.scrollY;
    window.parent.postMessage({attnlabHeight: Math.ceil(bottom)}, "*");
  }

  return {MAX_CANVAS, root, element, fail, boot, inflate, integers, floats, clip, shown, rgb,
          setPalette, colour, linearScale, logScale, sizeCanvas, mapImage, colourBar, select,
          reportHeight};
})();
