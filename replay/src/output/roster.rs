//! The steady decoders as the outputs see them: who is a member of each
//! instance's cohort, read from the compact notes of the step reports
//! ([`CohortNote`](crate::engine::instance::CohortNote)). A member's tokens
//! are kept as a count (the steps of the notes since it joined), turned into
//! its token run only when it leaves or another event concerns it, so that
//! a step costs the outputs O(1) whatever the number of members.

use crate::engine::instance::CohortJoin;

/// A member, by tag.
#[derive(Debug, Clone, Copy)]
pub(super) struct Member {
    pub(super) instance: u32,
    pub(super) join: CohortJoin,
    /// Its instance's [`Roster::steps_done`] when it joined.
    pub(super) s0: u64,
    /// Its index in [`Roster::tags`].
    pub(super) pos: u32,
}

/// One instance's members.
#[derive(Debug, Clone, Default)]
pub(super) struct Roster {
    /// The members' tags (in no particular order).
    pub(super) tags: Vec<u32>,
    /// What counting the members' gaps needs of each, beside its tag in
    /// [`Roster::tags`] (read in order, without a lookup per member).
    pub(super) spans: Vec<MemberSpan>,
    /// The largest output length of its members so far.
    pub(super) max_target: u32,
    /// Members that joined since the last steps (their first token's gap
    /// is their own).
    pub(super) fresh: Vec<u32>,
    /// Steps of the notes so far.
    pub(super) steps_done: u64,
    /// The instance's index of the step after the last steps of the notes.
    pub(super) next_step: u64,
    /// The instance's index of the first step of its report being
    /// delivered.
    pub(super) report_first_step: u64,
    /// The end of the instance's step before that report, µs.
    pub(super) prev_end: Option<i64>,
    /// The end of the last step of that report, µs.
    pub(super) last_end: Option<i64>,
}

/// The tokens of a member: its output index at its instance's
/// [`Roster::steps_done`] `s0` (when it joined), and its output length.
#[derive(Debug, Clone, Copy)]
pub(super) struct MemberSpan {
    pub(super) s0: u64,
    pub(super) next_index: u32,
    pub(super) target: u32,
}

/// A member's tokens when it leaves: `(count, instance index of the first
/// step)`, none when it produced none as a member.
pub(super) fn tokens_of(m: &Member, r: &Roster) -> Option<(u32, u64)> {
    let count = r.steps_done - m.s0;
    (count > 0).then(|| (count as u32, r.next_step - count))
}

/// The members of every instance, by tag.
#[derive(Debug, Default)]
pub(super) struct Rosters {
    pub(super) by_tag: Vec<Option<Member>>,
    pub(super) of: Vec<Roster>,
}

impl Rosters {
    pub(super) fn roster(&mut self, instance: u32) -> &mut Roster {
        let i = instance as usize;
        if self.of.len() <= i {
            self.of.resize(i + 1, Roster::default());
        }
        &mut self.of[i]
    }

    /// Whether `tag` is a member (of any instance).
    #[inline]
    pub(super) fn contains(&self, tag: u32) -> bool {
        self.by_tag.get(tag as usize).is_some_and(Option::is_some)
    }

    /// Adds a member of `instance`.
    pub(super) fn join(&mut self, instance: u32, join: CohortJoin) {
        let r = self.roster(instance);
        let m = Member {
            instance,
            join,
            s0: r.steps_done,
            pos: r.tags.len() as u32,
        };
        r.tags.push(join.tag);
        r.spans.push(MemberSpan {
            s0: r.steps_done,
            next_index: join.next_index,
            target: join.target,
        });
        r.max_target = r.max_target.max(join.target);
        r.fresh.push(join.tag);
        let t = join.tag as usize;
        if self.by_tag.len() <= t {
            self.by_tag.resize(t + 1, None);
        }
        self.by_tag[t] = Some(m);
    }

    /// Removes every member of `instance`, each with its tokens as a
    /// member, into `out`.
    pub(super) fn leave_all(&mut self, instance: u32, out: &mut Vec<(Member, Option<(u32, u64)>)>) {
        let Some(r) = self.of.get_mut(instance as usize) else {
            return;
        };
        r.fresh.clear();
        let tags = std::mem::take(&mut r.tags);
        for &tag in &tags {
            if let Some(m) = self.by_tag[tag as usize].take() {
                out.push((m, tokens_of(&m, r)));
            }
        }
        // (The vector goes back empty, for its capacity.)
        r.tags = tags;
        r.tags.clear();
        r.spans.clear();
    }

    /// Removes member `tag`; returns it with its tokens as a member.
    pub(super) fn leave(&mut self, tag: u32) -> Option<(Member, Option<(u32, u64)>)> {
        let m = self.by_tag.get_mut(tag as usize)?.take()?;
        let r = &mut self.of[m.instance as usize];
        let pos = m.pos as usize;
        r.tags.swap_remove(pos);
        r.spans.swap_remove(pos);
        if let Some(&moved) = r.tags.get(pos)
            && let Some(other) = self.by_tag[moved as usize].as_mut()
        {
            other.pos = pos as u32;
        }
        let tokens = tokens_of(&m, r);
        if tokens.is_none()
            && let Some(i) = r.fresh.iter().position(|&t| t == tag)
        {
            r.fresh.swap_remove(i);
        }
        Some((m, tokens))
    }
}
