// The charts of the last 10 minutes, drawn on <canvas> by the page itself: messages in and out
// per second, drops per second, open connections. /api/history gives the past at load; each
// status poll adds a point, its rates from the difference of the broker's totals. Until there
// are 10 minutes to show, a chart spans what there is (a minute at least).

import { integer, rate } from "./format.js";

const SPAN_SECONDS = 600;
// A chart shows at least this long, and more as it has more, up to SPAN_SECONDS.
const SHORTEST_SECONDS = 60;
// Points further apart than this are not joined: the page or the broker was away.
const GAP_SECONDS = 5;
const LABEL_HEIGHT = 14;

const $ = (selector) => document.querySelector(selector);

// The smallest 1, 2 or 5 times a power of ten at or above `value` (at least 1).
function ceiling(value) {
  if (!(value > 1)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  return [1, 2, 5, 10].map((step) => step * power).find((step) => step >= value);
}

function colour(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#333";
}

export class Charts {
  constructor() {
    this.points = []; // {time, published, delivered, dropped, connections}, oldest first
    this.last = null; // the last poll's totals, for the next one's rates
    this.charts = [
      { canvas: $("#chart-messages"), per: "s",
        series: [["published", "--in", $("#chart-messages-in")],
                 ["delivered", "--out", $("#chart-messages-out")]] },
      { canvas: $("#chart-drops"), per: "s",
        series: [["dropped", "--dropped", $("#chart-drops-now")]] },
      { canvas: $("#chart-connections"), per: "",
        series: [["connections", "--connections", $("#chart-connections-now")]] },
    ];
    new ResizeObserver(() => this.draw()).observe($("#charts"));
  }

  // The API's history ({interval, points}), before what the polls have added since.
  history(answer) {
    const points = (answer?.points ?? []).filter((point) => Number.isFinite(point.time));
    if (!points.length) return;
    const end = points[points.length - 1].time;
    this.points = [...points, ...this.points.filter((point) => point.time > end)];
    this.trim();
  }

  // A status poll: its time on the broker's clock, its totals, its count of connections.
  poll(status, connections) {
    const broker = status.broker;
    const time = Number.isFinite(broker.started) && Number.isFinite(broker.uptime)
      ? broker.started + broker.uptime : Date.now() / 1000;
    // The same processes since the last poll, else the totals are not comparable.
    const same = `${broker.started} ${status.nodes.join(" ")}`;
    const point = { time, published: null, delivered: null, dropped: null, connections };
    const last = this.last;
    if (last && last.same === same && time > last.time) {
      for (const name of ["published", "delivered", "dropped"]) {
        point[name] = Math.max(0, broker[name] - last[name]) / (time - last.time);
      }
    }
    this.last = { same, time, published: broker.published, delivered: broker.delivered,
                  dropped: broker.dropped };
    const newest = this.points[this.points.length - 1];
    if (!newest || time > newest.time) this.points.push(point);
    this.trim();
  }

  trim() {
    const end = this.points.length ? this.points[this.points.length - 1].time : 0;
    const start = this.points.findIndex((point) => point.time >= end - SPAN_SECONDS);
    if (start > 0) this.points.splice(0, start);
  }

  draw() {
    for (const chart of this.charts) this.drawOne(chart);
  }

  drawOne({ canvas, series, per }) {
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (!width || !height) return;
    const ratio = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
    }
    const draw = canvas.getContext("2d");
    draw.setTransform(ratio, 0, 0, ratio, 0, 0);
    draw.clearRect(0, 0, width, height);
    const points = this.points;
    const now = points.length ? points[points.length - 1].time : Date.now() / 1000;
    const span = Math.min(SPAN_SECONDS,
      Math.max(SHORTEST_SECONDS, points.length ? now - points[0].time : 0));
    let highest = 0;
    for (const point of points) {
      for (const [name] of series) highest = Math.max(highest, point[name] ?? 0);
    }
    const top = ceiling(highest);
    const plotTop = LABEL_HEIGHT;
    const plotBottom = height - LABEL_HEIGHT;
    const y = (value) => plotBottom - (value / top) * (plotBottom - plotTop);
    const x = (time) => width * (1 - (now - time) / span);

    draw.strokeStyle = colour("--grid");
    draw.lineWidth = 1;
    draw.beginPath();
    for (const value of [0, top / 2, top]) {
      draw.moveTo(0, Math.round(y(value)) + 0.5);
      draw.lineTo(width, Math.round(y(value)) + 0.5);
    }
    draw.stroke();
    draw.fillStyle = colour("--axis");
    draw.font = "11px system-ui, sans-serif";
    draw.textBaseline = "top";
    draw.textAlign = "left";
    draw.fillText(per ? `${integer(top)}/${per}` : integer(top), 2, 1);
    draw.textBaseline = "bottom";
    draw.fillText(`${Math.round(span / 60)} min ago`, 2, height);
    draw.textAlign = "right";
    draw.fillText("now", width - 2, height);

    draw.lineWidth = 1.5;
    draw.lineJoin = "round";
    for (const [name, colourName, legend] of series) {
      draw.strokeStyle = colour(colourName);
      draw.beginPath();
      let previous = null;
      for (const point of points) {
        const value = point[name];
        if (value === null || value === undefined) {
          previous = null;
          continue;
        }
        if (previous === null || point.time - previous.time > GAP_SECONDS) {
          draw.moveTo(x(point.time), y(value));
        } else {
          draw.lineTo(x(point.time), y(value));
        }
        previous = point;
      }
      draw.stroke();
      let latest = null;
      for (let at = points.length - 1; at >= 0 && latest === null; at -= 1) {
        if (Number.isFinite(points[at][name])) latest = points[at][name];
      }
      legend.textContent = latest === null ? "" : per ? `${rate(latest)}/${per}` : integer(latest);
    }
  }
}
