// Names, times and durations as people read them.

import type { DescEnum } from "@bufbuild/protobuf";
import type { Duration, Timestamp } from "@bufbuild/protobuf/wkt";

// enumName is a value's name in the .proto: RUN_STATUS_RUNNING.
export function enumName(e: DescEnum, n: number): string {
  return e.value[n]?.name ?? String(n);
}

// shortName drops the enum's prefix: RUNNING.
export function shortName(e: DescEnum, n: number): string {
  return e.value[n]?.localName ?? String(n);
}

// words is a value as people read it: "Awaiting decision" for
// RUN_STATUS_AWAITING_DECISION.
export function words(e: DescEnum, n: number): string {
  const w = shortName(e, n).replace(/_/g, " ").toLowerCase();
  return w.charAt(0).toUpperCase() + w.slice(1);
}

export function tsMs(t: Pick<Timestamp, "seconds" | "nanos"> | undefined): number | undefined {
  if (!t) return undefined;
  return Number(t.seconds) * 1000 + t.nanos / 1e6;
}

export function durMs(d: Pick<Duration, "seconds" | "nanos"> | undefined): number {
  if (!d) return 0;
  return Number(d.seconds) * 1000 + d.nanos / 1e6;
}

// fmtMs writes a duration shortly: 0.25ms, 850ms, 2.4s, 3m05s, 2h10m, 3d4h.
export function fmtMs(ms: number): string {
  if (!isFinite(ms)) return "–";
  if (ms < 0) ms = 0;
  // Under a millisecond: the hundredths (a call answered on loopback).
  if (ms > 0 && ms < 1) return ms < 0.01 ? "<0.01ms" : +ms.toFixed(2) + "ms";
  if (ms < 1000) return Math.round(ms) + "ms";
  const s = ms / 1000;
  if (s < 10) return s.toFixed(1) + "s";
  if (s < 60) return Math.floor(s) + "s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
  const hr = Math.floor(m / 60);
  if (hr < 48) return hr + "h" + String(m % 60).padStart(2, "0") + "m";
  return Math.floor(hr / 24) + "d" + (hr % 24) + "h";
}

export function fmtTime(ms: number | undefined): string {
  if (ms === undefined) return "";
  return new Date(ms).toLocaleString();
}

export function isoTime(ms: number | undefined): string {
  return ms === undefined ? "" : new Date(ms).toISOString();
}

const units: Record<string, number> = { ns: 1e-6, us: 1e-3, "µs": 1e-3, ms: 1, s: 1000, m: 60000, h: 3600000 };

// parseDuration reads a Go-style duration ("100ms", "1.5s", "1m30s") as
// milliseconds; undefined when s is not one.
export function parseDuration(s: string): number | undefined {
  s = s.trim();
  if (s === "0") return 0;
  const re = /(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)/y;
  let total = 0;
  let i = 0;
  while (i < s.length) {
    re.lastIndex = i;
    const m = re.exec(s);
    if (!m) return undefined;
    total += parseFloat(m[1]) * units[m[2]];
    i = re.lastIndex;
  }
  return i > 0 ? total : undefined;
}

// durationOf is ms as a google.protobuf.Duration's fields.
export function durationOf(ms: number): { seconds: bigint; nanos: number } {
  const ns = Math.round(ms * 1e6);
  const seconds = Math.floor(ns / 1e9);
  return { seconds: BigInt(seconds), nanos: ns - seconds * 1e9 };
}

// fmtExact writes ms as a Go duration that parseDuration reads back
// exactly: 100ms, 1.5s, 1m30s, 2h0m0.25s.
export function fmtExact(ms: number): string {
  if (ms === 0) return "0";
  if (ms < 1000) return +ms.toFixed(6) + "ms";
  const hr = Math.floor(ms / 3600000);
  const m = Math.floor((ms % 3600000) / 60000);
  const s = +((ms % 60000) / 1000).toFixed(9);
  return (hr ? hr + "h" + m + "m" : m ? m + "m" : "") + s + "s";
}
