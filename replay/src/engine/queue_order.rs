//! Wait-queue orders and request priorities.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fmt;
use std::str::FromStr;

/// The order in which waiting requests are considered for admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SchedulerPolicy {
    /// First come, first served; a preempted request goes back to the front.
    #[default]
    Fcfs,
    /// Priority (lower value = more urgent, as vLLM), then arrival.
    PriorityFcfs,
    /// Shortest input first, then arrival.
    Sjf,
    /// The least urgent first (pathological, for tests of policies).
    ReversePriority,
    /// By the request's priority number as its key, like `priority-fcfs`,
    /// but preempting the latest request to join the batch, as `fcfs`
    /// does: what a scheduling tree or program with `preempt: latest`
    /// runs ([`crate::cluster::scheduling`]).
    KeyLatest,
}

impl FromStr for SchedulerPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fcfs" => Ok(Self::Fcfs),
            "priority-fcfs" | "priority" => Ok(Self::PriorityFcfs),
            "sjf" => Ok(Self::Sjf),
            "reverse-priority" => Ok(Self::ReversePriority),
            "key-latest" => Ok(Self::KeyLatest),
            other => Err(format!(
                "unknown scheduler {other:?} (fcfs, priority-fcfs, sjf, reverse-priority, key-latest)"
            )),
        }
    }
}

impl fmt::Display for SchedulerPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Fcfs => "fcfs",
            Self::PriorityFcfs => "priority-fcfs",
            Self::Sjf => "sjf",
            Self::ReversePriority => "reverse-priority",
            Self::KeyLatest => "key-latest",
        })
    }
}

/// vLLM-style priority of an SLO class: lower is more urgent. `critical` 0,
/// `standard` (and empty or unknown) 1, `sheddable` 2, `batch` 3,
/// `background` 4; v1 names `realtime` 0 and `interactive` 1.
pub fn slo_priority(slo_class: &str) -> u8 {
    match slo_class {
        "critical" | "realtime" => 0,
        "sheddable" => 2,
        "batch" => 3,
        "background" => 4,
        _ => 1,
    }
}

/// Ordering key of a waiting request: (primary, secondary, sequence).
pub type QueueKey = (i64, i64, u64);

impl SchedulerPolicy {
    /// The queue key of a request with `priority`, `input_tokens`, enqueued
    /// `seq`-th.
    pub fn key(self, priority: i64, input_tokens: u32, seq: u64) -> QueueKey {
        match self {
            Self::Fcfs => (0, 0, seq),
            Self::PriorityFcfs | Self::KeyLatest => (priority, 0, seq),
            Self::Sjf => (i64::from(input_tokens), 0, seq),
            Self::ReversePriority => (priority.saturating_neg(), 0, seq),
        }
    }
}

/// The wait queue of one instance, holding request slots.
#[derive(Debug, Clone)]
pub enum WaitQueue {
    /// FCFS: a deque (preempted requests re-enter at the front).
    Fifo(VecDeque<u32>),
    /// Ordered by key; preempted requests re-enter by their key.
    Keyed(BinaryHeap<Reverse<(QueueKey, u32)>>),
}

impl WaitQueue {
    /// An empty queue for `policy`.
    pub fn new(policy: SchedulerPolicy) -> Self {
        match policy {
            SchedulerPolicy::Fcfs => Self::Fifo(VecDeque::new()),
            _ => Self::Keyed(BinaryHeap::new()),
        }
    }

    /// Adds a newly arrived request.
    pub fn push(&mut self, slot: u32, key: QueueKey) {
        match self {
            Self::Fifo(q) => q.push_back(slot),
            Self::Keyed(h) => h.push(Reverse((key, slot))),
        }
    }

    /// Puts back a preempted request (front of a FIFO queue).
    pub fn push_preempted(&mut self, slot: u32, key: QueueKey) {
        match self {
            Self::Fifo(q) => q.push_front(slot),
            Self::Keyed(h) => h.push(Reverse((key, slot))),
        }
    }

    /// The next request to consider.
    pub fn peek(&self) -> Option<u32> {
        match self {
            Self::Fifo(q) => q.front().copied(),
            Self::Keyed(h) => h.peek().map(|Reverse((_, s))| *s),
        }
    }

    /// Removes the next request.
    pub fn pop(&mut self) -> Option<u32> {
        match self {
            Self::Fifo(q) => q.pop_front(),
            Self::Keyed(h) => h.pop().map(|Reverse((_, s))| s),
        }
    }

    /// Removes `slot` wherever it is (a cancelled request).
    pub fn remove(&mut self, slot: u32) {
        match self {
            Self::Fifo(q) => q.retain(|&s| s != slot),
            Self::Keyed(h) => h.retain(|Reverse((_, s))| *s != slot),
        }
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        match self {
            Self::Fifo(q) => q.len(),
            Self::Keyed(h) => h.len(),
        }
    }

    /// Whether none wait.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
