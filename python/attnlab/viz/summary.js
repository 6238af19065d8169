// attnlab summaries viewer: a long input drawn from the summaries of its attention (pooled
// maps with zoomable blocks, attention received, entropy, top-k keys) instead of its maps.
// Plain JavaScript, no libraries, no network. attnlab.viz inlines this file into the page after
// common.js, together with the data, a JSON block with the id "attnlab-data" (see
// attnlab/viz/summary.py for its fields).
(function () {
  "use strict";

  const {root, element, boot, floats, integers, clip, shown, rgb, setPalette, colour,
         linearScale, logScale, sizeCanvas, mapImage, colourBar, select,
         reportHeight} = attnlabViz;

  const MAP_SIZE = 440;      // the pooled map and a zoomed block aim at this many pixels
  const MARGIN = 40;         // room above the maps for their axis labels
  const LEFT = 60;           // and left of them (row labels up to 6 digits)
  const PLOT_LEFT = 70;      // room left of the sequence plots for their y axis
  const PLOT_WIDTH = 1000;   // pixels the sequence plots give to positions
  const PLOT_HEIGHT = 120;
  const ARC_HEIGHT = 190;
  const DRAG = 4;            // a press that moves fewer pixels than this is a click
  const LABEL_GAP = 6;       // pixels kept free between two key labels under the arcs

  let spec;
  const data = {};
  // block: the pooled block zoomed into, [q_block, k_block]; from, to: the positions the
  // sequence plots show; hover: the position under the mouse; drag, selection: a drag under way.
  const state = {batch: 0, layer: 0, head: 0, query: 0, block: null, hoverBlock: null,
                 scale: "log", from: 0, to: 1, hover: null, drag: null, selection: null};
  const ui = {};

  // ---- data ---------------------------------------------------------------------------

  function counts() {
    return {B: spec.batch.length, L: spec.layers.length, H: spec.heads.length,
            Q: spec.queries, K: spec.keys, N: Math.max(spec.queries, spec.keys),
            nq: spec.pool ? Math.ceil(spec.queries / spec.pool) : 0,
            nk: spec.pool ? Math.ceil(spec.keys / spec.pool) : 0, k: spec.k || 0};
  }

  function zoomKey(b, l, h, qb, kb) { return [b, l, h, qb, kb].join(","); }

  async function decode() {
    const {B, L, H, Q, K, nq, nk, k} = counts();
    const maps = B * L * H;
    if (spec.received) data.received = await floats(spec.received, maps * K, "received attention");
    if (spec.entropy) data.entropy = await floats(spec.entropy, maps * Q, "entropies");
    if (spec.pooled) data.pooled = await floats(spec.pooled, maps * nq * nk, "pooled maps");
    if (spec.topk_top) {
      data.topkTop = await floats(spec.topk_top, maps * Q, "top-k weights");
      data.topkRatios = await floats(spec.topk_ratios, maps * Q * k, "top-k weights");
      data.topkDistances = await integers(spec.topk_distances, maps * Q * k, "top-k keys");
    }
    data.zoom = new Map();
    for (const block of spec.zoom) {
      block.values = await floats(block, block.rows * block.cols, "block weights");
      data.zoom.set(zoomKey(block.batch, block.layer, block.head, block.q_block, block.k_block),
                    block);
    }
    data.meanEntropy = new Map();  // per batch entry: [L × H] means, computed when first shown
  }

  function mapIndex(l, h) {
    const {L, H} = counts();
    return (state.batch * L + (l === undefined ? state.layer : l)) * H +
           (h === undefined ? state.head : h);
  }

  // The current layer and head's run of `length` values in a decoded array.
  function run(array, length, l, h) {
    const i = mapIndex(l, h);
    return array.subarray(i * length, (i + 1) * length);
  }

  // [[key, weight, error], ...] of query q, strongest first. The page holds each query's
  // largest weight (16 bits of a log scale) and the others as fractions of it (8 bits of a log
  // scale); error is half a step of each.
  function topkOf(q) {
    const {Q, k} = counts();
    const row = mapIndex() * Q + q;
    const top = data.topkTop[row];
    const topError = logError(spec.topk_top, mapIndex());
    const ratioError = logError(spec.topk_ratios, mapIndex());
    const result = [];
    for (let j = 0; j < k; j++) {
      const w = top * data.topkRatios[row * k + j];
      result.push([q - data.topkDistances[row * k + j], w,
                   w * (j === 0 ? topError : topError + ratioError)]);
    }
    return result;
  }

  function blockZoom(qb, kb) {
    return data.zoom.get(zoomKey(state.batch, state.layer, state.head, qb, kb));
  }

  // ---- text ---------------------------------------------------------------------------

  function number(x, digits) {  // four significant digits (what the page stores) or fewer
    const d = digits || 4;
    if (x === 0) return "0";
    const size = Math.abs(x);
    if (size >= 10 ** d) return x.toFixed(0);
    if (size < 1e-3) return x.toExponential(d - 1);
    return x.toPrecision(d);
  }

  // A stored value known to ± error: its digits down to the place of the error's first digit
  // (≈ when that leaves fewer than four).
  function approx(x, error) {
    if (x === 0 || !(error > 0)) return number(x);
    const digits = Math.floor(Math.log10(Math.abs(x))) - Math.floor(Math.log10(error)) + 1;
    const kept = Math.max(1, Math.min(4, digits));
    return (kept < 4 ? "≈" : "") + number(x, kept);
  }

  // Half a step of a log-quantized array's group, relative to the value (html.py: pack).
  function logError(packed, group) {
    const top = 2 ** packed.bits - 1, g = group || 0;
    return Math.exp(Math.log(packed.highs[g] / packed.lows[g]) / (top - 1) / 2) - 1;
  }

  function tokenOf(list, p) {
    return list ? ` “${clip(shown(list[state.batch][p]))}”` : "";
  }
  function keyTokens() { return spec.key_tokens || spec.query_tokens; }
  function queryName(q) { return `query ${q}` + tokenOf(spec.query_tokens, q); }
  function keyName(k) { return `key ${k}` + tokenOf(keyTokens(), k); }

  function where() {
    return `layer ${spec.layers[state.layer]}, head ${spec.heads[state.head]}`;
  }

  function info(text) { ui.info.textContent = text; }

  function defaultInfo() {
    info("Hover over the maps and plots to read their values. Click a block of the pooled map " +
         "to zoom into it; click on the sequence or use the slider to choose a query; drag " +
         "across a plot to zoom into positions, double-click for all of them.");
  }

  function note(text, className) {
    return element("p", "attnlab-note" + (className ? " " + className : ""), text);
  }

  // ---- controls -----------------------------------------------------------------------

  function button(text, className, onClick) {
    const node = element("button", className, text);
    node.type = "button";
    node.addEventListener("click", onClick);
    return node;
  }

  function buildControls() {
    const bar = element("div", "attnlab-controls");
    if (spec.batch.length > 1) {
      ui.batch = select("Example", spec.batch.map((b, i) => [i, String(b)]), (i) => {
        state.batch = i; render();
      });
      ui.batch.wrap.classList.add("attnlab-batch");
      bar.append(ui.batch.wrap);
    }
    ui.layer = select("Layer", spec.layers.map((l, i) => [i, String(l)]), (i) => {
      state.layer = i; render();
    });
    ui.layer.wrap.classList.add("attnlab-layer");
    ui.head = select("Head", spec.heads.map((h, i) => [i, String(h)]), (i) => {
      state.head = i; render();
    });
    ui.head.wrap.classList.add("attnlab-head");
    ui.scale = select("Scale", [[0, "log"], [1, "linear"]], (i) => {
      state.scale = i ? "linear" : "log"; render();
    });
    ui.scale.wrap.classList.add("attnlab-scale");
    bar.append(ui.layer.wrap, ui.head.wrap, ui.scale.wrap);
    return bar;
  }

  function syncControls() {
    if (ui.batch) ui.batch.box.value = String(state.batch);
    ui.layer.box.value = String(state.layer);
    ui.head.box.value = String(state.head);
    ui.scale.box.value = state.scale === "log" ? "0" : "1";
    Object.assign(root.dataset, {batch: state.batch, layer: state.layer, head: state.head,
                                 scale: state.scale});
  }

  // Colours for a map's positive values on the chosen scale (zero stays blank under log).
  function scaleFor(values) {
    let max = 0, min = Infinity;
    for (const v of values) {
      if (v > max) max = v;
      if (v > 0 && v < min) min = v;
    }
    if (state.scale === "linear" || max === 0) {
      return {scale: linearScale(max), low: "0", high: number(max)};
    }
    return {scale: logScale(min, max), low: number(min), high: number(max) + " (log)"};
  }

  // ---- heat maps (pooled map and zoomed block) --------------------------------------------

  // The chosen query's row in a heat map: a red mark in the left margin at height y.
  function queryMark(context, y) {
    context.fillStyle = "#d62728";
    context.beginPath();
    context.moveTo(LEFT - 1, y);
    context.lineTo(LEFT - 8, y - 4);
    context.lineTo(LEFT - 8, y + 4);
    context.fill();
  }

  // A heat map of [rows, cols] values with a transparent overlay canvas on top for marks;
  // `cell` is the side of one cell in CSS px (below 1 when there are more cells than pixels).
  function heatMap(values, rows, cols, className, axes) {
    const cell = Math.max(rows, cols) <= MAP_SIZE ? Math.floor(MAP_SIZE / Math.max(rows, cols))
                                                  : MAP_SIZE / Math.max(rows, cols);
    const width = LEFT + cols * cell + 6, height = MARGIN + rows * cell + 6;
    const wrap = element("div", "attnlab-heat " + className);
    const canvas = element("canvas", "attnlab-heat-canvas");
    const overlay = element("canvas", "attnlab-heat-overlay");
    const context = sizeCanvas(canvas, width, height);
    sizeCanvas(overlay, width, height);
    const {scale, low, high} = scaleFor(values);
    context.fillStyle = "#fff";
    context.fillRect(0, 0, width, height);
    context.imageSmoothingEnabled = cell < 1;
    context.drawImage(mapImage(values, rows, cols, scale), LEFT, MARGIN, cols * cell,
                      rows * cell);
    context.strokeStyle = "#bbb";
    context.strokeRect(LEFT - 0.5, MARGIN - 0.5, cols * cell + 1, rows * cell + 1);
    context.fillStyle = "#333";
    context.font = "11px sans-serif";
    context.textBaseline = "bottom";
    context.textAlign = "left";
    context.fillText(axes.cols[0], LEFT, MARGIN - 14);
    context.textAlign = "right";
    context.fillText(axes.cols[1], LEFT + cols * cell, MARGIN - 14);
    context.textAlign = "center";
    context.fillText(axes.across, LEFT + cols * cell / 2, MARGIN - 2);
    context.save();
    context.translate(LEFT - 12, MARGIN + rows * cell / 2);  // clear of the query's mark
    context.rotate(-Math.PI / 2);
    context.fillText(axes.down, 0, 0);
    context.restore();
    context.textAlign = "right";
    context.textBaseline = "top";
    context.fillText(axes.rows[0], LEFT - 16, MARGIN);
    context.textBaseline = "bottom";
    context.fillText(axes.rows[1], LEFT - 16, MARGIN + rows * cell);
    wrap.append(canvas, overlay);
    // Where the cells are (CSS px within the canvas), for anyone scripting the page.
    Object.assign(overlay.dataset, {left: LEFT, top: MARGIN, cellWidth: cell, cellHeight: cell,
                                    rows: rows, cols: cols});
    const cellAt = (event) => {
      const box = overlay.getBoundingClientRect();
      const c = Math.floor((event.clientX - box.left - LEFT) / cell);
      const r = Math.floor((event.clientY - box.top - MARGIN) / cell);
      return r >= 0 && r < rows && c >= 0 && c < cols ? {row: r, col: c} : null;
    };
    return {wrap: wrap, overlay: overlay, cell: cell, width: width, height: height,
            bar: colourBar(low, high), cellAt: cellAt};
  }

  function renderPooled() {
    const panel = ui.pooled;
    panel.replaceChildren(element("h2", "attnlab-section-title", "Pooled map"));
    if (!data.pooled) {
      panel.append(note("No pooled map was recorded: summarize(pool=64, ...) records one."));
      ui.drawPooled = null;
      return;
    }
    const {Q, K, nq, nk} = counts();
    const P = spec.pool;
    const values = run(data.pooled, nq * nk);
    const map = heatMap(values, nq, nk, "attnlab-pooled-map",
                        {across: "keys →", down: "← queries", cols: ["0", String(K)],
                         rows: ["0", String(Q)]});
    panel.append(element("div", "attnlab-caption",
                         `${where()}: the mean weight of each block of ${P} × ${P} ` +
                         `(${nq} × ${nk} blocks)`), map.bar, map.wrap);
    const draw = () => {
      const o = map.overlay.getContext("2d");
      o.clearRect(0, 0, map.width, map.height);
      const c = map.cell;
      const box = (r, k, style, width) => {
        o.strokeStyle = style;
        o.lineWidth = width;
        o.strokeRect(LEFT + k * c - width / 2, MARGIN + r * c - width / 2,
                     c + width, c + width);
      };
      for (const block of spec.zoom) {  // blocks whose weights the page carries
        if (block.batch === state.batch && block.layer === state.layer &&
            block.head === state.head) box(block.q_block, block.k_block, "#fff", 1.5);
      }
      if (state.hoverBlock) box(state.hoverBlock.row, state.hoverBlock.col, "#000", 1);
      if (state.block) box(state.block[0], state.block[1], "#d62728", 2);
      queryMark(o, MARGIN + (state.query + 0.5) / P * c);
    };
    map.overlay.addEventListener("mousemove", (event) => {
      const cell = map.cellAt(event);
      state.hoverBlock = cell;
      draw();
      if (!cell) { defaultInfo(); return; }
      const {row, col} = cell;
      const embedded = blockZoom(row, col) ? "click to see its weights"
                                           : "click to zoom (its weights are not in the page)";
      info(`${where()}: queries ${row * P}–${Math.min(Q, (row + 1) * P) - 1} → keys ` +
           `${col * P}–${Math.min(K, (col + 1) * P) - 1} (block ${row}, ${col}): mean weight ` +
           `${number(values[row * nk + col])}; ${embedded}`);
    });
    map.overlay.addEventListener("mouseleave", () => {
      state.hoverBlock = null; draw(); defaultInfo();
    });
    map.overlay.addEventListener("click", (event) => {
      const cell = map.cellAt(event);
      if (cell) chooseBlock([cell.row, cell.col]);
    });
    ui.drawPooled = draw;
    draw();
  }

  function chooseBlock(block) {
    state.block = block;
    if (ui.drawPooled) ui.drawPooled();
    renderZoom();
    reportHeight();
  }

  function zoomButtons() {
    const list = element("div", "attnlab-zoom-blocks");
    const mine = spec.zoom.filter((b) => b.batch === state.batch && b.layer === state.layer &&
                                         b.head === state.head);
    if (!mine.length) return list;
    list.append(element("span", null, "Blocks in the page:"));
    for (const block of mine) {
      const node = button(`${block.q_block}, ${block.k_block}`, "attnlab-zoom-block",
                          () => chooseBlock([block.q_block, block.k_block]));
      node.dataset.block = `${block.q_block},${block.k_block}`;
      node.setAttribute("aria-pressed", String(!!state.block && state.block[0] ===
                                               block.q_block && state.block[1] === block.k_block));
      list.append(node);
    }
    return list;
  }

  function renderZoom() {
    const panel = ui.zoom;
    panel.replaceChildren(element("h2", "attnlab-section-title", "Block weights"));
    ui.drawZoom = null;
    root.dataset.block = state.block ? state.block.join(",") : "";
    root.dataset.zoom = "";
    if (!spec.pool) {
      panel.append(note("Nothing to zoom into: " + spec.zoom_note + "."));
      return;
    }
    if (!state.block) {
      panel.append(note("Click a block of the pooled map to see its weights, query by key. " +
                        "The outlined blocks' weights are in the page" +
                        (spec.zoom.length ? "." : ` (none here: ${spec.zoom_note}).`)),
                   zoomButtons());
      return;
    }
    const {Q, K} = counts();
    const P = spec.pool;
    const [qb, kb] = state.block;
    const q0 = qb * P, k0 = kb * P;
    const q1 = Math.min(Q, q0 + P), k1 = Math.min(K, k0 + P);
    const entry = blockZoom(qb, kb);
    panel.append(element("div", "attnlab-caption",
                         `${where()}: queries ${q0}–${q1 - 1} × keys ${k0}–${k1 - 1} ` +
                         `(block ${qb}, ${kb})`));
    if (!entry) {
      root.dataset.zoom = "missing";
      panel.append(note(`This block's weights are not in the page: ${spec.zoom_note}, e.g. ` +
                        `zoom=[(${spec.layers[state.layer]}, ${spec.heads[state.head]}, ` +
                        `${qb}, ${kb})].`, "attnlab-zoom-missing"), zoomButtons());
      return;
    }
    root.dataset.zoom = "embedded";
    const values = entry.values;
    const error = logError(entry);
    const map = heatMap(values, entry.rows, entry.cols, "attnlab-zoom-map",
                        {across: "keys →", down: "← queries",
                         cols: [String(k0), String(k1 - 1)], rows: [String(q0), String(q1 - 1)]});
    const pooled = data.pooled ? run(data.pooled, counts().nq * counts().nk)[qb * counts().nk + kb]
                               : NaN;
    panel.append(element("div", "attnlab-caption attnlab-zoom-mean",
                         `mean of these ${entry.rows} × ${entry.cols} weights ` +
                         `${number(entry.mean)} (pooled map: ${number(pooled)}); stored in ` +
                         `${entry.bits} bits`),
                 map.bar, map.wrap, zoomButtons());
    const draw = (cell) => {
      const o = map.overlay.getContext("2d");
      o.clearRect(0, 0, map.width, map.height);
      if (state.query >= q0 && state.query < q1) {
        queryMark(o, MARGIN + (state.query - q0 + 0.5) * map.cell);
      }
      if (!cell) return;
      o.strokeStyle = "#000";
      o.lineWidth = 1;
      const c = Math.max(map.cell, 2);
      o.strokeRect(LEFT + cell.col * map.cell - 0.5, MARGIN + cell.row * map.cell - 0.5,
                   c + 1, c + 1);
    };
    map.overlay.addEventListener("mousemove", (event) => {
      const cell = map.cellAt(event);
      draw(cell);
      if (!cell) { defaultInfo(); return; }
      const w = values[cell.row * entry.cols + cell.col];
      info(`${where()}: ${queryName(q0 + cell.row)} → ${keyName(k0 + cell.col)}: weight ` +
           approx(w, w * error));
    });
    map.overlay.addEventListener("mouseleave", () => { draw(null); defaultInfo(); });
    map.overlay.addEventListener("click", (event) => {
      const cell = map.cellAt(event);
      if (cell) setQuery(q0 + cell.row);
    });
    ui.drawZoom = () => draw(null);
    draw(null);
  }

  // ---- entropy grid -------------------------------------------------------------------

  function meanEntropies() {
    if (!data.meanEntropy.has(state.batch)) {
      const {L, H, Q} = counts();
      const means = [];
      for (let l = 0; l < L; l++) {
        for (let h = 0; h < H; h++) {
          const values = run(data.entropy, Q, l, h);
          let sum = 0;
          for (const v of values) sum += v;
          means.push(sum / Q);
        }
      }
      data.meanEntropy.set(state.batch, means);
    }
    return data.meanEntropy.get(state.batch);
  }

  function renderGrid() {
    const panel = ui.grid;
    panel.replaceChildren(element("h2", "attnlab-section-title", "Entropy of each head"));
    if (!data.entropy) {
      panel.append(note("No entropy was recorded: summarize(entropy=True, ...) records it."));
      return;
    }
    const {L, H, K} = counts();
    const means = meanEntropies();
    // Coloured on the entropy's own range, 0 (all weight on one key) to ln K (uniform): scaled
    // between the heads' lowest and highest means, heads that differ in the third digit looked
    // as far apart as one-key and uniform heads.
    const top = Math.log(K);
    const table = element("table", "attnlab-entropy-grid");
    const head = element("tr");
    head.append(element("th"));
    spec.heads.forEach((h) => head.append(element("th", null, "head " + h)));
    table.append(head);
    for (let l = 0; l < L; l++) {
      const row = element("tr");
      row.append(element("th", null, "layer " + spec.layers[l]));
      for (let h = 0; h < H; h++) {
        const mean = means[l * H + h];
        const t = top > 0 ? Math.min(Math.max(mean / top, 0), 1) : 0.5;
        const [r, g, b] = colour(t);
        const cell = element("td", "attnlab-entropy-cell", number(mean));
        cell.style.backgroundColor = `rgb(${r},${g},${b})`;
        cell.style.color = t < 0.6 ? "#fff" : "#000";  // viridis is dark at its low end
        cell.dataset.layer = String(l);
        cell.dataset.head = String(h);
        cell.title = `layer ${spec.layers[l]}, head ${spec.heads[h]}: mean entropy ` +
                     `${number(mean)} nats`;
        if (l === state.layer && h === state.head) cell.classList.add("attnlab-current");
        cell.addEventListener("click", () => {
          state.layer = l; state.head = h; render();
        });
        row.append(cell);
      }
      table.append(row);
    }
    panel.append(element("div", "attnlab-caption",
                         `Mean entropy of each head's queries, in nats (uniform over all ${K} ` +
                         `keys: ln ${K} = ${Math.log(K).toFixed(2)}), coloured from 0 (dark) ` +
                         `to ln ${K} (light). Click a head to show it.`),
                 table);
  }

  // ---- sequence plots -----------------------------------------------------------------

  function xOf(p) {
    return PLOT_LEFT + (p - state.from + 0.5) * PLOT_WIDTH / (state.to - state.from);
  }

  // The positions under pixel column x: [first, last + 1) (one position when zoomed in).
  function positionsAt(x) {
    const n = state.to - state.from;
    const column = Math.max(0, Math.min(PLOT_WIDTH - 1, Math.floor(x - PLOT_LEFT)));
    if (n <= PLOT_WIDTH) {
      const p = state.from + Math.floor((x - PLOT_LEFT) * n / PLOT_WIDTH);
      const q = Math.max(state.from, Math.min(state.to - 1, p));
      return [q, q + 1];
    }
    return [state.from + Math.floor(column * n / PLOT_WIDTH),
            state.from + Math.floor((column + 1) * n / PLOT_WIDTH)];
  }

  function plotCanvas(className, height, label) {
    const canvas = element("canvas", "attnlab-plot " + className);
    sizeCanvas(canvas, PLOT_LEFT + PLOT_WIDTH + 12, height);
    canvas.setAttribute("aria-label", label);
    return canvas;
  }

  // A series along the positions of the window: bars when each position has a pixel or more,
  // else per pixel column a faint bar up to the largest value and a solid stroke over the
  // range of values (so a single spike among thousands still shows).
  function drawSeries(canvas, values, title, log) {
    const height = PLOT_HEIGHT;
    const top = 18, bottom = height - 18;
    const context = canvas.getContext("2d");
    context.clearRect(0, 0, PLOT_LEFT + PLOT_WIDTH + 12, height);
    context.font = "11px sans-serif";
    context.fillStyle = "#333";
    context.textBaseline = "top";
    context.textAlign = "left";
    context.fillText(title, PLOT_LEFT, 2);
    if (!values) {
      context.fillText("not recorded", PLOT_LEFT, 40);
      return;
    }
    const from = state.from, to = Math.min(state.to, values.length);
    let max = 0, min = Infinity;
    for (let p = from; p < to; p++) {
      const v = values[p];
      if (v > max) max = v;
      if (v > 0 && v < min) min = v;
    }
    const useLog = log && max > 0 && min < max;
    const y = useLog
      ? (v) => v > 0 ? bottom - (Math.log(v) - Math.log(min)) / (Math.log(max) - Math.log(min))
                                * (bottom - top) : bottom
      : (v) => max > 0 ? bottom - v / max * (bottom - top) : bottom;
    const [r, g, b] = rgb(spec.head_colours[state.head]);
    const n = state.to - state.from;
    if (n <= PLOT_WIDTH) {
      const width = PLOT_WIDTH / n;
      context.fillStyle = `rgb(${r},${g},${b})`;
      for (let p = from; p < to; p++) {
        const x = PLOT_LEFT + (p - from) * width;
        const yv = y(values[p]);
        context.fillRect(x, yv, Math.max(1, width > 4 ? width - 1 : width), bottom - yv);
      }
    } else {
      for (let c = 0; c < PLOT_WIDTH; c++) {
        const a = from + Math.floor(c * n / PLOT_WIDTH);
        const e = Math.min(to, from + Math.floor((c + 1) * n / PLOT_WIDTH));
        if (a >= e) continue;
        let hi = -Infinity, lo = Infinity;
        for (let p = a; p < e; p++) {
          if (values[p] > hi) hi = values[p];
          if (values[p] < lo) lo = values[p];
        }
        context.fillStyle = `rgba(${r},${g},${b},0.3)`;
        context.fillRect(PLOT_LEFT + c, y(hi), 1, bottom - y(hi));
        context.fillStyle = `rgb(${r},${g},${b})`;
        context.fillRect(PLOT_LEFT + c, y(hi), 1, Math.max(1, y(lo) - y(hi)));
      }
    }
    context.strokeStyle = "#999";
    context.lineWidth = 1;
    context.beginPath();
    context.moveTo(PLOT_LEFT - 0.5, top);
    context.lineTo(PLOT_LEFT - 0.5, bottom + 0.5);
    context.lineTo(PLOT_LEFT + PLOT_WIDTH, bottom + 0.5);
    context.stroke();
    context.fillStyle = "#333";
    context.textAlign = "right";
    context.textBaseline = "top";
    context.fillText(number(max), PLOT_LEFT - 4, top - 2);
    context.textBaseline = "bottom";
    context.fillText(useLog ? number(min) : "0", PLOT_LEFT - 4, bottom + 2);
    if (useLog) context.fillText("log", PLOT_LEFT - 4, (top + bottom) / 2 + 6);
    positionTicks(context, bottom + 3);
    marks(context, top, bottom);
  }

  function positionTicks(context, y) {
    context.fillStyle = "#555";
    context.textBaseline = "top";
    context.textAlign = "left";
    context.fillText(String(state.from), PLOT_LEFT, y);
    context.textAlign = "right";
    context.fillText(String(state.to - 1), PLOT_LEFT + PLOT_WIDTH, y);
  }

  // The hovered position, the chosen query and a drag's selection, on every plot.
  function marks(context, top, bottom) {
    if (state.selection) {
      const [a, b] = state.selection;
      context.fillStyle = "rgba(43,93,138,0.18)";
      context.fillRect(Math.min(a, b), top, Math.abs(b - a), bottom - top);
    }
    const line = (p, style, dash) => {
      if (p === null || p < state.from || p >= state.to) return;
      context.strokeStyle = style;
      context.setLineDash(dash);
      context.beginPath();
      context.moveTo(Math.round(xOf(p)) + 0.5, top);
      context.lineTo(Math.round(xOf(p)) + 0.5, bottom);
      context.stroke();
      context.setLineDash([]);
    };
    line(state.query, "rgba(214,39,40,0.8)", [3, 3]);
    line(state.hover, "rgba(0,0,0,0.6)", []);
  }

  function drawPlots() {
    const {K, Q} = counts();
    drawSeries(ui.received, data.received && run(data.received, K),
               `Attention received by each key (Σ over queries), ${where()}`,
               state.scale === "log");
    drawSeries(ui.entropy, data.entropy && run(data.entropy, Q),
               `Entropy of each query's weights (nats), ${where()}`, false);
    drawArcs();
    ui.window.textContent = `Positions ${state.from}–${state.to - 1} of ${counts().N}`;
    Object.assign(root.dataset, {from: state.from, to: state.to});
  }

  function hoverText(kind, x) {
    const [a, e] = positionsAt(x);
    const {K, Q} = counts();
    if (kind === "arcs") {
      const p = Math.min(a, Q - 1);
      return [p, `${queryName(p)}: click to show its top-${spec.k || "k"} keys`];
    }
    const received = kind === "received";
    const array = received ? data.received : data.entropy;
    if (!array) return [a, null];
    const values = run(array, received ? K : Q);
    const end = Math.min(e, values.length);
    if (a >= end) return [null, null];
    if (end - a === 1) {
      return [a, received ? `${where()}: ${keyName(a)} receives ${number(values[a])}`
                          : `${where()}: ${queryName(a)}: entropy ${number(values[a])} nats`];
    }
    let hi = a, lo = a;
    for (let p = a; p < end; p++) {
      if (values[p] > values[hi]) hi = p;
      if (values[p] < values[lo]) lo = p;
    }
    const span = `${received ? "keys" : "queries"} ${a}–${end - 1}`;
    return [hi, received
      ? `${where()}: ${span}: most received by ${keyName(hi)}: ${number(values[hi])} ` +
        `(least ${number(values[lo])}); drag to zoom in`
      : `${where()}: ${span}: entropy from ${number(values[lo])} (${queryName(lo)}) to ` +
        `${number(values[hi])} (${queryName(hi)}) nats; drag to zoom in`];
  }

  function attachPlot(canvas, kind) {
    const xIn = (event) => event.clientX - canvas.getBoundingClientRect().left;
    canvas.addEventListener("mousedown", (event) => {
      state.drag = {start: xIn(event), canvas: canvas};
      event.preventDefault();
    });
    canvas.addEventListener("mousemove", (event) => {
      const x = xIn(event);
      if (state.drag) {
        state.selection = [Math.max(PLOT_LEFT, Math.min(PLOT_LEFT + PLOT_WIDTH, state.drag.start)),
                           Math.max(PLOT_LEFT, Math.min(PLOT_LEFT + PLOT_WIDTH, x))];
      }
      const [p, text] = hoverText(kind, x);
      state.hover = p;
      if (text) info(text);
      drawPlots();
    });
    canvas.addEventListener("mouseleave", () => {
      state.hover = null;
      drawPlots();
      defaultInfo();
    });
    canvas.addEventListener("dblclick", () => setWindow(0, counts().N));
  }

  // A press and release: a click chooses the query under it, a drag zooms into what it spans.
  function release(event) {
    if (!state.drag) return;
    const drag = state.drag;
    const x = event.clientX - drag.canvas.getBoundingClientRect().left;
    state.drag = null;
    state.selection = null;
    if (Math.abs(x - drag.start) < DRAG) {
      const [a] = positionsAt(x);
      setQuery(Math.min(a, counts().Q - 1));
      return;
    }
    const first = positionsAt(Math.min(x, drag.start))[0];
    const last = positionsAt(Math.max(x, drag.start))[1];
    setWindow(first, last);
  }

  function setWindow(from, to) {
    const {N} = counts();
    from = Math.max(0, Math.min(N - 1, from));
    to = Math.max(from + 1, Math.min(N, to));
    state.from = from;
    state.to = to;
    drawPlots();
  }

  // The query and its top keys, with a little room around them.
  function fitQuery() {
    let first = state.query, last = state.query;
    if (data.topkTop) {
      for (const [key, w] of topkOf(state.query)) {
        if (w > 0) { first = Math.min(first, key); last = Math.max(last, key); }
      }
    }
    const room = Math.max(4, Math.ceil((last - first + 1) * 0.05));
    setWindow(first - room, last + room + 1);
  }

  function setQuery(q) {
    const {Q} = counts();
    state.query = Math.max(0, Math.min(Q - 1, q));
    if (state.query < state.from || state.query >= state.to) {  // keep it in view
      const width = state.to - state.from;
      const from = Math.max(0, Math.min(counts().N - width, state.query - Math.floor(width / 2)));
      state.from = from;
      state.to = from + width;
    }
    ui.slider.value = String(state.query);
    ui.queryInput.value = String(state.query);
    root.dataset.query = String(state.query);
    drawPlots();
    renderTopk();
    if (ui.drawPooled) ui.drawPooled();
    if (ui.drawZoom) ui.drawZoom();
    reportHeight();
  }

  // ---- top-k arcs ---------------------------------------------------------------------

  function drawArcs() {
    const canvas = ui.arcs;
    const context = canvas.getContext("2d");
    const base = ARC_HEIGHT - 40;
    context.clearRect(0, 0, PLOT_LEFT + PLOT_WIDTH + 12, ARC_HEIGHT);
    context.font = "11px sans-serif";
    context.fillStyle = "#333";
    context.textBaseline = "top";
    context.textAlign = "left";
    const q = state.query;
    context.fillText(`Top-${spec.k || "k"} keys of ${queryName(q)}, ${where()}`, PLOT_LEFT, 2);
    context.strokeStyle = "#999";
    context.beginPath();
    context.moveTo(PLOT_LEFT, base + 0.5);
    context.lineTo(PLOT_LEFT + PLOT_WIDTH, base + 0.5);
    context.stroke();
    canvas.dataset.query = String(q);
    if (!data.topkTop) {
      context.fillText("not recorded: summarize(topk=8, ...) records them", PLOT_LEFT, 40);
      canvas.dataset.arcs = "0";
      return;
    }
    const keys = topkOf(q).filter(([, w]) => w > 0);
    const strongest = keys.reduce((most, [, w]) => Math.max(most, w), 0);
    const [r, g, b] = rgb(spec.head_colours[state.head]);
    const x0 = xOf(q);
    context.save();
    context.beginPath();
    context.rect(PLOT_LEFT, 16, PLOT_WIDTH, base - 16 + 1);
    context.clip();  // arcs to keys outside the window leave the plot at its edge
    for (let i = keys.length - 1; i >= 0; i--) {  // the strongest drawn last, on top
      const [key, w] = keys[i];
      const strength = w / strongest;
      context.strokeStyle = `rgba(${r},${g},${b},${(0.25 + 0.75 * strength).toFixed(3)})`;
      context.lineWidth = 1 + 5 * strength;
      context.beginPath();
      const x1 = xOf(key);
      if (key === q) {  // a query's own key: a loop above it
        context.arc(x0, base - 9, 9, 0, 2 * Math.PI);
      } else {
        const rise = Math.min(base - 24, Math.max(12, Math.abs(x1 - x0) / 2));
        context.moveTo(x0, base);
        context.quadraticCurveTo((x0 + x1) / 2, base - 2 * rise, x1, base);
      }
      context.stroke();
    }
    context.restore();
    canvas.dataset.arcs = String(keys.length);
    // The query (a red mark) and its keys' names under the axis, where they fit.
    if (q >= state.from && q < state.to) {
      context.fillStyle = "#d62728";
      context.beginPath();
      context.moveTo(x0, base);
      context.lineTo(x0 - 5, base + 8);
      context.lineTo(x0 + 5, base + 8);
      context.fill();
    }
    const labels = [[x0, spec.query_tokens ? clip(shown(spec.query_tokens[state.batch][q]), 12)
                                           : String(q), "#d62728"]];
    for (const [key] of keys) {
      if (key === q || key < state.from || key >= state.to) continue;
      labels.push([xOf(key), keyTokens() ? clip(shown(keyTokens()[state.batch][key]), 12)
                                         : String(key), "#333"]);
    }
    context.textBaseline = "top";
    context.textAlign = "center";
    const taken = [];
    for (const [x, text, style] of labels) {
      const half = context.measureText(text).width / 2;
      if (x < PLOT_LEFT || x > PLOT_LEFT + PLOT_WIDTH) continue;
      // Kept whole inside the canvas, and never over a label already drawn.
      const at = Math.max(half, Math.min(PLOT_LEFT + PLOT_WIDTH + 12 - half, x));
      if (taken.some(([a, e]) => at - half < e + LABEL_GAP && at + half > a - LABEL_GAP)) continue;
      taken.push([at - half, at + half]);
      context.fillStyle = style;
      context.fillText(text, at, base + 10);
    }
    context.fillStyle = "#555";
    positionTicks(context, base + 26);
    marks(context, 16, base);
  }

  function renderTopk() {
    const list = ui.topk;
    list.replaceChildren();
    if (!data.topkTop) return;
    const q = state.query;
    const keys = topkOf(q).filter(([, w]) => w > 0);
    if (!keys.length) {
      list.append(element("li", "attnlab-topk-none",
                          "no key: every key is masked for this query"));
      return;
    }
    for (const [key, w, error] of keys) {
      const distance = q - key;
      const item = element("li", "attnlab-topk-item",
                           `${keyName(key)}: ${approx(w, error)} ` +
                           (distance === 0 ? "(itself)" : distance > 0 ? `(${distance} back)`
                                                                       : `(${-distance} ahead)`));
      item.dataset.key = String(key);
      list.append(item);
    }
  }

  // ---- page ---------------------------------------------------------------------------

  function buildSequence() {
    const section = element("section", "attnlab-sequence");
    section.append(element("h2", "attnlab-section-title", "Along the sequence"));
    const bar = element("div", "attnlab-window-bar");
    ui.window = element("span", "attnlab-window");
    bar.append(ui.window,
               button("All positions", "attnlab-window-all", () => setWindow(0, counts().N)),
               button("Fit the query's keys", "attnlab-window-fit", fitQuery));
    ui.received = plotCanvas("attnlab-received", PLOT_HEIGHT, "attention received per key");
    ui.entropy = plotCanvas("attnlab-entropy", PLOT_HEIGHT, "entropy per query");
    ui.arcs = plotCanvas("attnlab-arcs", ARC_HEIGHT, "top-k keys of the chosen query");
    attachPlot(ui.received, "received");
    attachPlot(ui.entropy, "entropy");
    attachPlot(ui.arcs, "arcs");
    const {Q} = counts();
    const queryBar = element("div", "attnlab-query-bar");
    const label = element("label", "attnlab-control");
    label.append(element("span", null, "Query"));
    ui.slider = element("input", "attnlab-query-slider");
    Object.assign(ui.slider, {type: "range", min: "0", max: String(Q - 1), step: "1"});
    ui.slider.setAttribute("aria-label", "query position");
    ui.queryInput = element("input", "attnlab-query-input");
    Object.assign(ui.queryInput, {type: "number", min: "0", max: String(Q - 1), step: "1"});
    ui.queryInput.setAttribute("aria-label", "query position");
    ui.slider.addEventListener("input", () => setQuery(Number(ui.slider.value)));
    ui.queryInput.addEventListener("change", () => {
      const value = Math.round(Number(ui.queryInput.value));
      if (Number.isFinite(value)) setQuery(value);
    });
    label.append(ui.slider, ui.queryInput);
    queryBar.append(label);
    ui.topk = element("ol", "attnlab-topk");
    section.append(bar, ui.received, ui.entropy, ui.arcs, queryBar, ui.topk);
    return section;
  }

  function render() {
    syncControls();
    renderPooled();
    renderZoom();
    renderGrid();
    setQuery(state.query);
    root.dataset.renders = String(Number(root.dataset.renders || 0) + 1);
  }

  function start() {
    setPalette(spec.colour_map);
    const s = spec.start;
    Object.assign(state, {batch: s.batch, layer: s.layer, head: s.head, query: s.query,
                          from: 0, to: counts().N});
    root.replaceChildren();
    root.classList.add("attnlab-summaries");
    if (spec.title) root.append(element("h1", "attnlab-title", spec.title));
    root.append(buildControls());
    ui.info = element("div", "attnlab-info");
    ui.info.setAttribute("aria-live", "polite");
    const maps = element("div", "attnlab-summary-maps");
    ui.pooled = element("section", "attnlab-panel attnlab-pooled");
    ui.zoom = element("section", "attnlab-panel attnlab-zoom");
    ui.grid = element("section", "attnlab-panel attnlab-grid-panel");
    maps.append(ui.pooled, ui.zoom, ui.grid);
    root.append(ui.info, maps, buildSequence());
    window.addEventListener("mouseup", release);
    defaultInfo();
    render();
    if (typeof ResizeObserver !== "undefined") new ResizeObserver(reportHeight).observe(root);
    root.dataset.state = "ready";
  }

  boot(async (value) => {
    spec = value;
    await decode();
    start();
  });
})();
