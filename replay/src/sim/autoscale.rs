//! The driver's part of autoscaling ([`crate::cluster::autoscale`]):
//! replicas becoming ready, the periodic evaluations, and the drains of
//! the replicas removed (`wait`, `immediate`, `redirect`).

use blis_traces::Status;

use super::{Done, Driver, ENQUEUE, NotServed, Sink};
use crate::cluster::autoscale::{DrainPolicy, Lifecycle};
use crate::latency::LatencyModel;

impl Driver<'_> {
    /// The autoscaler's event at `now`: started replicas that are ready
    /// take requests from now on; an evaluation when one is due.
    pub(super) fn autoscale_at<S: Sink>(&mut self, now: i64, sink: &mut S) {
        let Some(a) = self.control.autoscale.as_deref_mut() else {
            return;
        };
        let mut ready = Vec::new();
        a.make_ready(now, &mut ready);
        let due = a.tick_due(now);
        if !ready.is_empty() {
            self.control.sync_decode_mask();
        }
        if due {
            self.evaluate_at(now, sink);
        }
        // Flow control: the cluster's room changed with its replicas.
        if (due || !ready.is_empty()) && !self.gateway.is_empty() {
            self.dispatch(now, sink);
        }
    }

    /// The autoscaler's evaluation at `now`, and the drains it starts.
    fn evaluate_at<S: Sink>(&mut self, now: i64, sink: &mut S) {
        // The evaluation reads every instance as it is at `now`.
        for i in 0..self.insts.len() {
            self.sync(i, now, sink);
        }
        let mut drain = Vec::new();
        let gateway = self.gateway.len();
        self.clock.touch_all();
        self.control
            .autoscale_tick(now, self.insts, gateway, &mut drain);
        self.control.sync_decode_mask();
        let policy = self
            .control
            .autoscale
            .as_ref()
            .map_or(DrainPolicy::Wait, |a| a.config().drain);
        for i in drain {
            match policy {
                DrainPolicy::Wait => {}
                DrainPolicy::Immediate => self.cut_off(now, i, sink),
                DrainPolicy::Redirect => self.redirect_waiting(now, i, sink),
            }
        }
        self.release_drained(now);
    }

    /// Whether instance `inst` takes a request routed to it earlier: a
    /// draining one only under the `wait` policy.
    pub(super) fn accepts(&self, inst: usize) -> bool {
        self.control.autoscale.as_ref().is_none_or(|a| {
            a.state(inst) == Lifecycle::Ready
                || (a.state(inst) == Lifecycle::Draining && a.config().drain == DrainPolicy::Wait)
        })
    }

    /// A request routed to an instance that no longer takes it reaches it
    /// at `now`: routed again (`redirect`) or cut off (`immediate`).
    pub(super) fn refused<S: Sink>(&mut self, now: i64, tag: u32, sink: &mut S) {
        let redirect = self
            .control
            .autoscale
            .as_ref()
            .is_some_and(|a| a.config().drain == DrainPolicy::Redirect);
        if redirect {
            self.reroute(now, tag, sink);
        } else {
            let f = self.take_flight(tag);
            self.count_cut();
            self.round_done(&f.rec, now);
            sink.not_served(*f.rec, f.entry_us, NotServed::ScaledDown);
            self.room_freed(now, sink);
        }
    }

    fn count_cut(&mut self) {
        if let Some(a) = self.control.autoscale.as_deref_mut() {
            a.counters.drain_cut += 1;
        }
    }

    /// The requests in instance `i`'s queue or batch: (tag, request id).
    fn enqueued_on(&self, i: usize) -> Vec<(u32, u64)> {
        self.flights
            .iter()
            .enumerate()
            .filter_map(|(tag, f)| {
                let f = f.as_ref()?;
                (f.inst as usize == i && f.enqueued)
                    .then_some((tag as u32, f.rec.request.request_id))
            })
            .collect()
    }

    /// `immediate`: every request on instance `i` ends at `now` with an
    /// error (those with tokens keep what they streamed); those not yet in
    /// its queue are refused when they get there.
    fn cut_off<S: Sink>(&mut self, now: i64, i: usize, sink: &mut S) {
        self.sync(i, now, sink);
        for (tag, id) in self.enqueued_on(i) {
            let Some(aborted) = self.inst_mut(i).abort(tag) else {
                continue;
            };
            let f = self.take_flight(tag);
            self.count_cut();
            self.round_done(&f.rec, now);
            if aborted.generated == 0 {
                sink.not_served(*f.rec, f.entry_us, NotServed::ScaledDown);
                continue;
            }
            let fin = super::cut_short(id, tag, &aborted, f.entry_us, now);
            sink.finished(Done {
                rec: *f.rec,
                entry_us: f.entry_us,
                fin: &fin,
                status: Status::Error,
            });
        }
    }

    /// `redirect`: the requests waiting on instance `i` with nothing
    /// computed are routed again at `now`.
    fn redirect_waiting<S: Sink>(&mut self, now: i64, i: usize, sink: &mut S) {
        self.sync(i, now, sink);
        for (tag, _) in self.enqueued_on(i) {
            if self.insts[i].waits_untouched(tag) {
                self.inst_mut(i).abort(tag);
                self.reroute(now, tag, sink);
            }
        }
    }

    /// Routes the flight `tag` again at `now` (its instance is draining);
    /// it enters its new instance's queue after the usual delays.
    fn reroute<S: Sink>(&mut self, now: i64, tag: u32, sink: &mut S) {
        let f = self.flights[tag as usize].as_mut().expect("live flight");
        let old = f.inst as usize;
        let rec = f.rec.clone();
        // Still in flight for admission; no longer on its old instance.
        self.control.handed_off(old);
        self.mark_drain_check(old);
        let inst = self.route(now, &rec, sink);
        let delay = self.insts[inst]
            .latency()
            .queueing_delay_us(rec.effective_input_tokens())
            .round() as i64
            + self.control.pipeline_latency_us;
        let hashes = self.control.take_hashes();
        let f = self.flights[tag as usize].as_mut().expect("live flight");
        f.inst = inst as u32;
        f.enqueued = false;
        f.hashes = hashes;
        if let Some(a) = self.control.autoscale.as_deref_mut() {
            a.counters.redirected += 1;
        }
        self.push(now + delay, ENQUEUE, tag);
    }

    /// A request left instance `i`: if it is draining, it may be empty.
    pub(super) fn mark_drain_check(&mut self, i: usize) {
        if let Some(a) = self.control.autoscale.as_deref_mut()
            && a.state(i) == Lifecycle::Draining
        {
            a.drain_pending = true;
        }
    }

    /// Draining instances with no request left free their GPU at `now`;
    /// their slot's next replica starts cold.
    pub(super) fn release_drained(&mut self, now: i64) {
        let Some(a) = self.control.autoscale.as_deref_mut() else {
            return;
        };
        if !std::mem::take(&mut a.drain_pending) {
            return;
        }
        for i in 0..self.insts.len() {
            let draining = self
                .control
                .autoscale
                .as_ref()
                .is_some_and(|a| a.state(i) == Lifecycle::Draining);
            if draining && self.control.in_flight_at(i) == 0 {
                if let Some(a) = self.control.autoscale.as_deref_mut() {
                    a.released(i, now);
                }
                self.inst_mut(i).restart_cold();
                self.control.forget(i);
            }
        }
    }
}
