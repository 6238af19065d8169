// attnlab attention viewer: a head view (token-to-token lines, or a heat map for long inputs)
// and a model view (a layers × heads grid of thumbnails). Plain JavaScript, no libraries, no
// network. attnlab.viz inlines this file into the page after common.js (the code both
// viewers share), together with the data, a JSON block with the id "attnlab-data" (see
// attnlab/viz/html.py for its fields).
(function () {
  "use strict";

  const ROW = 20;            // height of a token row in the line diagram (CSS px)
  const LINE_WIDTH = 240;    // width of the band the lines cross
  const HEAT_SIZE = 720;     // the heat map aims at this many pixels along its longer side
  const LEVELS = 64;         // line opacities are drawn in this many batches
  const LINE_BUDGET = 12000; // lines drawn at most in the overview of the line diagram
  const MIN_WEIGHT = 1 / 512; // lighter lines would not show

  const {MAX_CANVAS, root, element, boot, integers, clip, shown, rgb, setPalette,
         linearScale, sizeCanvas, mapImage, colourBar, select, reportHeight} = attnlabViz;
  let spec, values, units;
  const state = {view: "head", batch: 0, layer: 0, head: 0, mode: "lines",
                 hover: null, pinned: null};
  const ui = {};

  // ---- data ---------------------------------------------------------------------------

  async function decode() {
    const [B, L, H, Q, K] = spec.shape;
    values = await integers(spec, B * L * H * Q * K, "maps");
    const top = spec.bits === 16 ? 65535 : 255;
    units = Float64Array.from(spec.scales, (s) => s / top);
  }

  // The [Q, K] map of one batch entry, layer and head, as quantized integers, and the weight
  // of one step (each map is quantized relative to its own largest weight).
  function mapOf(b, l, h) {
    const [, L, H, Q, K] = spec.shape;
    const index = (b * L + l) * H + h;
    return {q: values.subarray(index * Q * K, (index + 1) * Q * K), unit: units[index]};
  }

  function shownHeads() {
    return state.head < 0 ? spec.heads.map((_, i) => i) : [state.head];
  }

  // Mean over the shown heads, as floats (one head: that head), and its largest entry.
  function combinedMap() {
    const [, , , Q, K] = spec.shape;
    const heads = shownHeads();
    const out = new Float32Array(Q * K);
    for (const h of heads) {
      const {q: m, unit} = mapOf(state.batch, state.layer, h);
      for (let i = 0; i < m.length; i++) out[i] += m[i] * unit;
    }
    let max = 0;
    const factor = 1 / heads.length;
    for (let i = 0; i < out.length; i++) {
      out[i] *= factor;
      if (out[i] > max) max = out[i];
    }
    return {map: out, max: max};
  }

  function weight(h, q, k) {
    const K = spec.shape[4];
    const {q: m, unit} = mapOf(state.batch, state.layer, h);
    return m[q * K + k] * unit;
  }

  function queryTokens() { return spec.query_tokens[state.batch]; }
  function keyTokens() { return spec.key_tokens[state.batch]; }

  function format(x) {  // as many digits as the stored precision carries
    if (x === 0) return "0";
    if (x < 0.001) return x.toExponential(spec.bits === 16 ? 3 : 2);
    return x.toFixed(spec.bits === 16 ? 4 : 3);
  }

  function colourScale(max) {
    return colourBar("0", format(max));
  }

  // ---- controls -----------------------------------------------------------------------

  function buildControls() {
    const bar = element("div", "attnlab-controls");
    const views = element("div", "attnlab-views");
    ui.viewButtons = {};
    for (const [view, text] of [["head", "Head view"], ["model", "Model view"]]) {
      const button = element("button", "attnlab-view-button", text);
      button.type = "button";
      button.dataset.view = view;
      button.addEventListener("click", () => { state.view = view; render(); });
      views.append(button);
      ui.viewButtons[view] = button;
    }
    bar.append(views);
    if (spec.batch.length > 1) {
      ui.batch = select("Example", spec.batch.map((b, i) => [i, String(b)]), (i) => {
        state.batch = i; state.hover = state.pinned = null; render();
      });
      ui.batch.wrap.classList.add("attnlab-batch");
      bar.append(ui.batch.wrap);
    }
    ui.layer = select("Layer", spec.layers.map((l, i) => [i, String(l)]), (i) => {
      state.layer = i; render();
    });
    ui.layer.wrap.classList.add("attnlab-layer");
    ui.head = select("Head", [[-1, "all"]].concat(spec.heads.map((h, i) => [i, String(h)])),
                     (i) => { state.head = i; render(); });
    ui.head.wrap.classList.add("attnlab-head");
    ui.mode = select("Draw", [[0, "lines"], [1, "heat map"]], (i) => {
      state.mode = i ? "heatmap" : "lines"; state.hover = state.pinned = null; render();
    });
    ui.mode.wrap.classList.add("attnlab-mode");
    if (!linesFit()) {  // too tall a canvas: heat maps only
      const option = ui.mode.box.options[0];
      option.disabled = true;
      option.textContent = `lines (up to ${Math.floor(MAX_CANVAS / ROW)} tokens)`;
    }
    bar.append(ui.layer.wrap, ui.head.wrap, ui.mode.wrap);
    ui.swatches = element("div", "attnlab-swatches");
    spec.heads.forEach((h, i) => {
      const swatch = element("button", "attnlab-swatch", String(h));
      swatch.type = "button";
      swatch.title = "head " + h;
      swatch.style.borderColor = spec.head_colours[i];
      swatch.style.setProperty("--swatch", spec.head_colours[i]);
      swatch.addEventListener("click", () => { state.head = i; render(); });
      ui.swatches.append(swatch);
    });
    bar.append(ui.swatches);
    return bar;
  }

  function linesFit() {
    return Math.max(spec.shape[3], spec.shape[4]) * ROW <= MAX_CANVAS;
  }

  function syncControls() {
    for (const [view, button] of Object.entries(ui.viewButtons)) {
      button.setAttribute("aria-pressed", String(view === state.view));
    }
    if (ui.batch) ui.batch.box.value = String(state.batch);
    ui.layer.box.value = String(state.layer);
    ui.head.box.value = String(state.head);
    ui.mode.box.value = state.mode === "heatmap" ? "1" : "0";
    const headView = state.view === "head";
    for (const control of [ui.layer.wrap, ui.head.wrap, ui.mode.wrap, ui.swatches]) {
      control.hidden = !headView;
    }
    ui.swatches.hidden = !headView || state.mode !== "lines";
    Array.from(ui.swatches.children).forEach((swatch, i) => {
      swatch.setAttribute("aria-pressed", String(state.head === i));
    });
    Object.assign(root.dataset, {view: state.view, mode: state.mode, batch: state.batch,
                                 layer: state.layer, head: state.head});
  }

  function info(text) {
    ui.info.textContent = text;
  }

  function defaultInfo() {
    if (state.view === "model") {
      info("Each thumbnail is one head's map (queries down, keys across, scaled to its own " +
           "maximum). Click one to open it in the head view.");
    } else if (state.mode === "lines") {
      info((ui.lineNote || "") + "Hover over a token to see where it looks (left: queries) " +
           "or what looks at it (right: keys); click to pin, Esc to release.");
    } else {
      info("Rows are queries, columns keys. Hover over a cell to read its weight; click to " +
           "pin, Esc to release.");
    }
  }

  // ---- head view: lines ---------------------------------------------------------------

  function tokenColumn(tokens, side) {
    const column = element("div", "attnlab-tokens attnlab-" + side);
    tokens.forEach((token, i) => {
      const cell = element("div", "attnlab-token", shown(token));
      cell.title = `${side === "q" ? "query" : "key"} ${i}: ${token}`;
      cell.dataset.side = side;
      cell.dataset.index = String(i);
      cell.tabIndex = 0;
      column.append(cell);
    });
    return column;
  }

  function renderLines(stage) {
    const [, , , Q, K] = spec.shape;
    const head = element("div", "attnlab-columns-head");
    head.append(element("span", null, "query"), element("span", null, "key"));
    const body = element("div", "attnlab-lines");
    ui.queryColumn = tokenColumn(queryTokens(), "q");
    ui.keyColumn = tokenColumn(keyTokens(), "k");
    ui.lineCanvas = element("canvas", "attnlab-line-canvas");
    sizeCanvas(ui.lineCanvas, LINE_WIDTH, Math.max(Q, K) * ROW);
    body.append(ui.queryColumn, ui.lineCanvas, ui.keyColumn);
    stage.append(head, body);

    const focusOn = (target) => {
      const cell = target.closest && target.closest(".attnlab-token");
      if (!cell || state.pinned) return;
      state.hover = {side: cell.dataset.side, index: Number(cell.dataset.index)};
      drawLines();
    };
    body.addEventListener("mouseover", (event) => focusOn(event.target));
    body.addEventListener("focusin", (event) => focusOn(event.target));
    body.addEventListener("mouseleave", () => {
      if (!state.pinned && state.hover) { state.hover = null; drawLines(); }
    });
    const pin = (target) => {
      const cell = target.closest && target.closest(".attnlab-token");
      if (!cell) return;
      const focus = {side: cell.dataset.side, index: Number(cell.dataset.index)};
      const same = state.pinned && state.pinned.side === focus.side &&
                   state.pinned.index === focus.index;
      state.pinned = same ? null : focus;
      state.hover = focus;
      drawLines();
    };
    body.addEventListener("click", (event) => pin(event.target));
    body.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") { event.preventDefault(); pin(event.target); }
    });
    drawLines();
  }

  // The weight below which lines are left out of the overview so that at most LINE_BUDGET
  // are drawn (a canvas strokes some 10^4 lines in a fraction of a second, 10^5 in seconds),
  // and how many lines that leaves out. The strongest links are the ones kept.
  function lineThreshold(heads, norm) {
    const BINS = 1024;
    const counts = new Uint32Array(BINS + 1);
    let total = 0;
    for (const h of heads) {
      const {q: m, unit} = mapOf(state.batch, state.layer, h);
      const factor = unit * norm * BINS;
      for (let i = 0; i < m.length; i++) {
        const bin = Math.min(BINS, Math.floor(m[i] * factor));
        counts[bin]++;
      }
    }
    const floor = Math.ceil(BINS * MIN_WEIGHT);
    let visible = 0;
    for (let bin = 0; bin <= BINS; bin++) {
      total += counts[bin];
      if (bin >= floor) visible += counts[bin];
    }
    if (visible <= LINE_BUDGET) return {threshold: MIN_WEIGHT, kept: visible, total: visible};
    let kept = 0, bin = BINS;
    while (bin > floor && kept + counts[bin] <= LINE_BUDGET) kept += counts[bin--];
    return {threshold: (bin + 1) / BINS, kept: kept, total: total};
  }

  function drawLines() {
    const [, , , Q, K] = spec.shape;
    const context = ui.lineCanvas.getContext("2d");
    context.clearRect(0, 0, LINE_WIDTH, Math.max(Q, K) * ROW);
    const focus = state.pinned || state.hover;
    const heads = shownHeads();
    const overlay = heads.length > 1;
    // A line's opacity is its weight (attention weights lie in [0, 1]; maps with larger
    // values are scaled by their largest), so heads, layers and examples compare on one scale
    // and a head that spreads its attention evenly looks faint.
    // A focused token's own lines are drawn relative to its strongest one instead, so that
    // where it looks stays visible even when it looks everywhere a little (the info line
    // gives the weights themselves).
    const qs = focus && focus.side === "q" ? [focus.index] : null;
    const ks = focus && focus.side === "k" ? [focus.index] : null;
    let norm = 1 / Math.max(1, spec.scale);
    if (focus) {
      let strongest = 0;
      for (const h of heads) {
        const count = qs ? K : Q;
        for (let j = 0; j < count; j++) {
          strongest = Math.max(strongest, qs ? weight(h, qs[0], j) : weight(h, j, ks[0]));
        }
      }
      norm = strongest > 0 ? 1 / strongest : 1;
    }
    const limit = focus ? {threshold: MIN_WEIGHT, kept: 0, total: 0} : lineThreshold(heads, norm);
    ui.lineNote = limit.kept < limit.total
      ? `Showing the ${limit.kept.toLocaleString("en")} strongest of the ` +
        `${limit.total.toLocaleString("en")} links (weights from ${limit.threshold.toFixed(4)}` +
        `). `
      : "";
    // Thin lines when there are many: a canvas strokes one-pixel lines far faster.
    context.lineWidth = focus ? 2 : limit.kept > 2000 ? 1 : overlay ? 1.5 : 2;
    heads.forEach((h, position) => {
      // Overlaid heads are drawn a little apart, so lines to the same token stay visible.
      const shift = overlay ? (position - (heads.length - 1) / 2) *
                              Math.min(2, (ROW - 6) / heads.length) : 0;
      const {q: m, unit} = mapOf(state.batch, state.layer, h);
      const paths = Array.from({length: LEVELS}, () => new Path2D());
      const used = new Uint8Array(LEVELS);
      const rowsToDraw = qs || Array.from({length: Q}, (_, q) => q);
      for (const q of rowsToDraw) {
        const y0 = q * ROW + ROW / 2 + shift;
        const count = ks ? 1 : K;
        for (let c = 0; c < count; c++) {
          const k = ks ? ks[0] : c;
          const w = m[q * K + k] * unit * norm;
          if (w < limit.threshold) continue;
          const level = Math.min(LEVELS - 1, Math.floor(w * LEVELS));
          paths[level].moveTo(0, y0);
          paths[level].lineTo(LINE_WIDTH, k * ROW + ROW / 2 + shift);
          used[level] = 1;
        }
      }
      const [r, g, b] = rgb(spec.head_colours[h]);
      for (let level = 0; level < LEVELS; level++) {
        if (!used[level]) continue;
        const alpha = Math.max(1 / 255, (level + 0.5) / LEVELS) * (overlay && !focus ? 0.8 : 1);
        context.strokeStyle = `rgba(${r},${g},${b},${alpha.toFixed(4)})`;
        context.stroke(paths[level]);
      }
    });
    markTokens(focus, heads);
  }

  function markTokens(focus, heads) {
    for (const column of [ui.queryColumn, ui.keyColumn]) {
      for (const cell of column.children) {
        cell.classList.remove("attnlab-focus", "attnlab-pinned");
        cell.style.backgroundColor = "";
      }
    }
    if (!focus) { defaultInfo(); return; }
    const own = focus.side === "q" ? ui.queryColumn : ui.keyColumn;
    const other = focus.side === "q" ? ui.keyColumn : ui.queryColumn;
    own.children[focus.index].classList.add(state.pinned ? "attnlab-pinned" : "attnlab-focus");
    const [r, g, b] = heads.length === 1 ? rgb(spec.head_colours[heads[0]]) : [110, 110, 110];
    const weights = [];
    for (let j = 0; j < other.children.length; j++) {
      let w = 0;
      for (const h of heads) {
        w += focus.side === "q" ? weight(h, focus.index, j) : weight(h, j, focus.index);
      }
      weights.push([w / heads.length, j]);
    }
    // The other side's tokens are shaded by their weight relative to the largest one.
    const largest = Math.max(...weights.map(([w]) => w)) || 1;
    for (const [w, j] of weights) {
      other.children[j].style.backgroundColor =
        `rgba(${r},${g},${b},${(0.55 * w / largest).toFixed(3)})`;
    }
    weights.sort((a, b) => b[0] - a[0]);
    const tokens = focus.side === "q" ? keyTokens() : queryTokens();
    const me = (focus.side === "q" ? queryTokens() : keyTokens())[focus.index];
    const which = heads.length === 1 ? "head " + spec.heads[heads[0]] : "mean of all heads";
    const top = weights.slice(0, 5)
      .map(([w, j]) => `${clip(shown(tokens[j]))} (${j}) ${format(w)}`);
    info((focus.side === "q" ? `query ${focus.index} “${clip(shown(me))}” looks at: `
                             : `key ${focus.index} “${clip(shown(me))}” is looked at by: `) +
         top.join(", ") + ` — ${which}${state.pinned ? " (pinned)" : ""}`);
  }

  // ---- head view: heat map ------------------------------------------------------------

  function renderHeatmap(stage) {
    const [, , , Q, K] = spec.shape;
    const cw = Math.max(1, Math.min(24, Math.floor(HEAT_SIZE / K)));
    const ch = Math.max(1, Math.min(24, Math.floor(HEAT_SIZE / Q)));
    const probe = document.createElement("canvas").getContext("2d");
    probe.font = "12px sans-serif";
    const widest = (tokens) => tokens.reduce(
      (most, t) => Math.max(most, probe.measureText(clip(shown(t))).width), 0);
    const rowLabels = ch >= 10, colLabels = cw >= 10;
    const left = rowLabels ? Math.ceil(widest(queryTokens())) + 10 : 8;
    const top = colLabels ? Math.ceil(widest(keyTokens())) + 10 : 8;
    const width = left + K * cw + 8, height = top + Q * ch + 8;

    const { map, max } = combinedMap();
    const wrap = element("div", "attnlab-heat");
    const canvas = element("canvas", "attnlab-heat-canvas");
    const overlay = element("canvas", "attnlab-heat-overlay");
    const context = sizeCanvas(canvas, width, height);
    sizeCanvas(overlay, width, height);
    context.fillStyle = "#fff";
    context.fillRect(0, 0, width, height);
    context.imageSmoothingEnabled = false;
    context.drawImage(mapImage(map, Q, K, linearScale(max)), left, top, K * cw, Q * ch);
    context.fillStyle = "#222";
    context.font = "12px sans-serif";
    if (rowLabels) {
      context.textAlign = "right";
      context.textBaseline = "middle";
      queryTokens().forEach((t, q) => {
        context.fillText(clip(shown(t)), left - 5, top + q * ch + ch / 2);
      });
    }
    if (colLabels) {
      context.save();
      context.textAlign = "left";
      context.textBaseline = "middle";
      context.rotate(-Math.PI / 2);
      keyTokens().forEach((t, k) => {
        context.fillText(clip(shown(t)), -(top - 5), left + k * cw + cw / 2);
      });
      context.restore();
    }
    wrap.append(canvas, overlay);
    // Where the cells are (CSS px within the canvas), for anyone scripting the page.
    Object.assign(overlay.dataset, {left: left, top: top, cellWidth: cw, cellHeight: ch});
    const which = state.head < 0 ? "mean of all heads" : "head " + spec.heads[state.head];
    const caption = element("div", "attnlab-caption",
                            `layer ${spec.layers[state.layer]}, ${which}: queries down (${Q}), ` +
                            `keys across (${K})`);
    stage.append(caption, colourScale(max), wrap);

    const cellAt = (event) => {
      const box = overlay.getBoundingClientRect();
      const k = Math.floor((event.clientX - box.left - left) / cw);
      const q = Math.floor((event.clientY - box.top - top) / ch);
      return q >= 0 && q < Q && k >= 0 && k < K ? {q: q, k: k} : null;
    };
    const draw = () => {
      const o = overlay.getContext("2d");
      o.clearRect(0, 0, width, height);
      const cell = state.pinned || state.hover;
      if (!cell) { defaultInfo(); return; }
      o.fillStyle = "rgba(255,255,255,0.25)";
      o.fillRect(left, top + cell.q * ch, K * cw, ch);
      o.fillRect(left + cell.k * cw, top, cw, Q * ch);
      o.strokeStyle = state.pinned ? "#d62728" : "#000";
      o.lineWidth = 2;
      o.strokeRect(left + cell.k * cw - 1.5, top + cell.q * ch - 1.5, cw + 3, ch + 3);
      const w = map[cell.q * K + cell.k];
      info(`query ${cell.q} “${clip(shown(queryTokens()[cell.q]))}” → key ${cell.k} ` +
           `“${clip(shown(keyTokens()[cell.k]))}”: ${format(w)} (${which})` +
           (state.pinned ? " (pinned)" : ""));
    };
    overlay.addEventListener("mousemove", (event) => {
      if (state.pinned) return;
      const cell = cellAt(event);
      if (cell && state.hover && cell.q === state.hover.q && cell.k === state.hover.k) return;
      state.hover = cell;
      draw();
    });
    overlay.addEventListener("mouseleave", () => {
      if (!state.pinned) { state.hover = null; draw(); }
    });
    overlay.addEventListener("click", (event) => {
      const cell = cellAt(event);
      const same = state.pinned && cell && state.pinned.q === cell.q && state.pinned.k === cell.k;
      state.pinned = same ? null : cell;
      state.hover = cell;
      draw();
    });
    ui.redrawHeat = draw;
    draw();
  }

  // ---- model view ---------------------------------------------------------------------

  function renderModel(stage) {
    const [, L, H, Q, K] = spec.shape;
    const side = H <= 4 ? 140 : H <= 8 ? 104 : H <= 12 ? 80 : 60;
    // Thumbnails keep the map's shape: the longer side gets `side` pixels.
    const tw = Q >= K ? Math.round(side * K / Q) : side;
    const th = Q >= K ? side : Math.round(side * Q / K);
    const grid = element("div", "attnlab-grid");
    grid.style.gridTemplateColumns = `auto repeat(${H}, ${Math.max(tw, 24)}px)`;
    grid.append(element("div"));
    spec.heads.forEach((h) => grid.append(element("div", "attnlab-grid-head", "head " + h)));
    spec.layers.forEach((layerName, l) => {
      grid.append(element("div", "attnlab-grid-layer", "layer " + layerName));
      spec.heads.forEach((headName, h) => {
        const {q: m, unit} = mapOf(state.batch, l, h);
        const floats = new Float32Array(m.length);
        let max = 0;
        for (let i = 0; i < m.length; i++) {
          floats[i] = m[i] * unit;
          if (floats[i] > max) max = floats[i];
        }
        const thumb = element("canvas", "attnlab-thumb");
        thumb.dataset.layer = String(l);
        thumb.dataset.head = String(h);
        thumb.title = `layer ${layerName}, head ${headName} (max ${format(max)}): click to open`;
        const context = sizeCanvas(thumb, tw, th);
        context.imageSmoothingEnabled = Q > th || K > tw;
        context.imageSmoothingQuality = "high";
        context.drawImage(mapImage(floats, Q, K, linearScale(max)), 0, 0, tw, th);
        if (l === state.layer && h === state.head) thumb.classList.add("attnlab-current");
        thumb.addEventListener("mouseenter", () => {
          info(`layer ${layerName}, head ${headName}: largest weight ${format(max)}. ` +
               "Click to open it in the head view.");
        });
        thumb.addEventListener("mouseleave", defaultInfo);
        thumb.addEventListener("click", () => {
          state.view = "head";
          state.layer = l;
          state.head = h;
          state.hover = state.pinned = null;
          render();
        });
        grid.append(thumb);
      });
    });
    stage.append(grid);
    defaultInfo();
  }

  // ---- page ---------------------------------------------------------------------------

  function render() {
    syncControls();
    ui.stage.replaceChildren();
    ui.redrawHeat = null;
    if (state.view === "model") renderModel(ui.stage);
    else if (state.mode === "heatmap") renderHeatmap(ui.stage);
    else renderLines(ui.stage);
    root.dataset.renders = String(Number(root.dataset.renders || 0) + 1);
    reportHeight();
  }

  function start() {
    setPalette(spec.colour_map);
    const s = spec.start;
    Object.assign(state, {view: s.view, batch: s.batch, layer: s.layer, head: s.head,
                          mode: s.mode === "lines" && !linesFit() ? "heatmap" : s.mode});
    root.replaceChildren();
    if (spec.title) root.append(element("h1", "attnlab-title", spec.title));
    root.append(buildControls());
    ui.info = element("div", "attnlab-info");
    ui.info.setAttribute("aria-live", "polite");
    ui.stage = element("div", "attnlab-stage");
    root.append(ui.info, ui.stage);
    document.addEventListener("keydown", (event) => {
      if (event.key !== "Escape" || !state.pinned) return;
      state.pinned = null;
      state.hover = null;
      if (state.view === "head" && state.mode === "lines") drawLines();
      else if (ui.redrawHeat) ui.redrawHeat();
    });
    render();
    if (typeof ResizeObserver !== "undefined") new ResizeObserver(reportHeight).observe(root);
    root.dataset.state = "ready";
  }

  boot(async (data) => {
    spec = data;
    await decode();
    start();
  });
})();
