// A WebSocket with awaitable messages: `await socket.next()` returns the next message, and
// rejects with a PlaygroundError when the socket closes first. Messages wait in a queue that
// is bounded by the protocols themselves (one frame in flight; realtime reads continuously).

import { PlaygroundError } from "./errors.js";

export class MessageSocket {
  constructor(surface, url, { decode = (data) => data } = {}) {
    this.surface = surface;
    this.decode = decode;
    this.queue = [];
    this.waiters = [];
    this.closeEvent = null;
    this.everOpened = false;
    this.ws = new WebSocket(url);
    this.ws.binaryType = "arraybuffer";
    this.opened = new Promise((resolve, reject) => {
      this.ws.addEventListener("open", () => { this.everOpened = true; resolve(); });
      this.ws.addEventListener("close", (event) => reject(this.closedError(event)));
    });
    this.ws.addEventListener("message", (event) => this.push(event.data));
    this.ws.addEventListener("close", (event) => {
      this.closeEvent = event;
      for (const waiter of this.waiters.splice(0)) waiter.reject(this.closedError(event));
    });
  }

  closedError(event) {
    if (!this.everOpened) {
      return new PlaygroundError(this.surface, { code: "connect_failed", closeCode: event.code,
        message: `WebSocket ${this.ws.url} could not be opened` });
    }
    return new PlaygroundError(this.surface, { code: "closed", closeCode: event.code,
      message: `the server closed the connection${event.reason ? `: ${event.reason}` : ""}` });
  }

  push(data) {
    let message;
    try {
      message = this.decode(data);
    } catch (exc) {
      message = { __decodeError: String(exc.message || exc) };
    }
    const waiter = this.waiters.shift();
    if (waiter) waiter.resolve(message);
    else this.queue.push(message);
  }

  /** The next message; rejects on close, or after `timeoutMs` when given. */
  next(timeoutMs = 0) {
    if (this.queue.length) return Promise.resolve(this.queue.shift());
    if (this.closeEvent) return Promise.reject(this.closedError(this.closeEvent));
    return new Promise((resolve, reject) => {
      const waiter = { resolve, reject };
      this.waiters.push(waiter);
      if (timeoutMs > 0) {
        setTimeout(() => {
          const index = this.waiters.indexOf(waiter);
          if (index < 0) return;
          this.waiters.splice(index, 1);
          reject(new PlaygroundError(this.surface, { code: "timeout", message: `no answer within ${timeoutMs / 1000} s` }));
        }, timeoutMs);
      }
    });
  }

  send(data) {
    if (this.ws.readyState !== WebSocket.OPEN) {
      throw new PlaygroundError(this.surface, { code: "closed", message: "the connection is closed" });
    }
    this.ws.send(data);
  }

  get isOpen() { return this.ws.readyState === WebSocket.OPEN; }

  close(code = 1000, reason = "") {
    if (this.ws.readyState <= WebSocket.OPEN) this.ws.close(code, reason);
  }
}
