// The server's clock, as this page estimates it: what time on a timeline,
// a countdown or an age is measured against. The browser's own clock may
// be off, and the time of the latest event is not now (a run awaiting a
// decision for an hour has no event since it asked).

export class ServerClock {
  // How far the browser's clock leads the server's: bounds (lower,
  // upper) and the latest answer's estimate (mid).
  private lower = -Infinity;
  private upper = Infinity;
  private mid?: number;
  private live = false;

  // answer takes an answer's server_time: the server read its clock
  // between sent and got (the browser's times of the call), so the lead
  // lies between sent and got minus it, within half the round trip of
  // their midpoint's.
  answer(sent: number, got: number, serverMs: number | undefined): void {
    if (serverMs === undefined) return;
    this.lower = Math.max(this.lower, sent - serverMs);
    this.upper = Math.min(this.upper, got - serverMs);
    this.mid = (sent + got) / 2 - serverMs;
  }

  // event takes the time (server's) of an event received now. It was made
  // before it arrived, so the browser's clock leads by at most now minus
  // its time: an upper bound, however old the event. Only an event the
  // caller knows is live (made as it was sent) is itself an estimate,
  // when no answer told the server's time (an older server).
  event(serverMs: number, live: boolean): void {
    this.upper = Math.min(this.upper, Date.now() - serverMs);
    if (live) this.live = true;
  }

  // lead is the estimate: the latest answer's, within the bounds (unless
  // they disagree: the server's clock was set back), else the live
  // events', else none.
  private lead(): number {
    if (this.mid !== undefined) {
      return this.lower <= this.upper ? Math.min(Math.max(this.mid, this.lower), this.upper) : this.mid;
    }
    return this.live && Number.isFinite(this.upper) ? this.upper : 0;
  }

  // now is the server's time now, as estimated.
  now(): number {
    return Date.now() - this.lead();
  }
}
