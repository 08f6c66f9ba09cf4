// A small latency chart on a <canvas>: the page's round trip as a line, the server's own
// latency as dots, the last `capacity` frames across the full width, y axis scaled to the
// largest value shown.

export class LatencyChart {
  constructor(canvas, capacity = 60) {
    this.canvas = canvas;
    this.ctx = canvas.getContext("2d");
    this.capacity = capacity;
    this.points = [];
    this.draw();
  }

  clear() { this.points = []; this.draw(); }

  add(roundTripMs, serverMs) {
    this.points.push({ roundTripMs, serverMs });
    if (this.points.length > this.capacity) this.points.shift();
    this.draw();
  }

  draw() {
    const { ctx, canvas, points } = this;
    const w = canvas.width, h = canvas.height, pad = 24;
    const style = getComputedStyle(canvas);
    ctx.clearRect(0, 0, w, h);
    ctx.fillStyle = style.getPropertyValue("--chart-bg") || "#111";
    ctx.fillRect(0, 0, w, h);
    const maxMs = Math.max(50, ...points.map((p) => Math.max(p.roundTripMs, p.serverMs ?? 0)));
    const x = (i) => pad + (i * (w - 2 * pad)) / Math.max(1, points.length - 1); // fill the width
    const y = (ms) => h - pad / 2 - (ms / maxMs) * (h - pad * 1.5);
    ctx.fillStyle = style.getPropertyValue("--chart-text") || "#aaa";
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillText(`${Math.round(maxMs)} ms`, 4, 12);
    ctx.fillText(points.length ? `last ${Math.round(points.at(-1).roundTripMs)} ms` : "no frames yet", w - 110, 12);
    ctx.strokeStyle = style.getPropertyValue("--chart-line") || "#4cc2ff";
    ctx.lineWidth = 2;
    ctx.beginPath();
    points.forEach((p, i) => (i ? ctx.lineTo(x(i), y(p.roundTripMs)) : ctx.moveTo(x(i), y(p.roundTripMs))));
    ctx.stroke();
    ctx.fillStyle = style.getPropertyValue("--chart-dot") || "#ffb347";
    points.forEach((p, i) => {
      if (p.serverMs == null) return;
      ctx.beginPath();
      ctx.arc(x(i), y(p.serverMs), 2.5, 0, Math.PI * 2);
      ctx.fill();
    });
  }
}
