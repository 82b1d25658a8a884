//! Step 4 of the assignment: placing the shards no holder keeps, through chains of
//! moves within replica sets when every replica of a shard is full.

use std::collections::VecDeque;

use super::types::NONE;

pub(super) struct Placer<'a> {
    /// Shards kept by their holder: chains move them only if nothing else works.
    pub(super) sticky: Vec<bool>,
    pub(super) replicas: &'a [u32],
    pub(super) r: usize,
    pub(super) preferred: &'a mut [u32],
    pub(super) loads: &'a mut [u32],
    pub(super) targets: &'a [u32],
    pub(super) assigned: Vec<Vec<u32>>,
}

impl Placer<'_> {
    fn reps(&self, s: u32) -> &[u32] {
        let s = s as usize;
        &self.replicas[s * self.r..(s + 1) * self.r]
    }

    fn has_room(&self, n: u32) -> bool {
        self.loads[n as usize] < self.targets[n as usize]
    }

    fn put(&mut self, s: u32, n: u32) {
        self.preferred[s as usize] = n;
        self.loads[n as usize] += 1;
        self.assigned[n as usize].push(s);
    }

    fn take(&mut self, s: u32, n: u32) {
        let list = &mut self.assigned[n as usize];
        if let Some(i) = list.iter().position(|x| *x == s) {
            list.swap_remove(i);
        }
        self.loads[n as usize] -= 1;
    }

    pub(super) fn place(&mut self, s: u32) {
        if let Some(&n) = self.reps(s).iter().find(|n| self.has_room(**n)) {
            self.put(s, n);
            return;
        }
        if self.augment(s, false) || self.augment(s, true) {
            return;
        }
        // No chain of moves frees a replica: the least loaded one goes over target.
        let reps = self.reps(s);
        let n = reps
            .iter()
            .enumerate()
            .min_by_key(|(rank, n)| (self.loads[**n as usize], *rank))
            .map(|(_, n)| *n)
            .unwrap_or(reps[0]);
        self.put(s, n);
    }

    /// Breadth-first search for the shortest chain `s → x₀, t₁: x₀ → x₁, …` ending at a
    /// node below target; applies it and returns true if found. Unless `move_kept`,
    /// the chain moves only shards placed in this round, not ones kept by a holder.
    fn augment(&mut self, s: u32, move_kept: bool) -> bool {
        let n = self.loads.len();
        // parent[x] = (shard that would move into x, node it comes from or NONE for s).
        let mut parent: Vec<Option<(u32, u32)>> = vec![None; n];
        let mut queue = VecDeque::new();
        for &x in self.reps(s) {
            parent[x as usize] = Some((s, NONE));
            queue.push_back(x);
        }
        let mut visited = queue.len();
        let mut end = queue.iter().copied().find(|x| self.has_room(*x));
        'search: while let Some(x) = queue.pop_front() {
            if end.is_some() || visited == n {
                break;
            }
            for &t in &self.assigned[x as usize] {
                if !move_kept && self.sticky[t as usize] {
                    continue;
                }
                for &y in self.reps(t) {
                    if y != x && parent[y as usize].is_none() {
                        parent[y as usize] = Some((t, x));
                        visited += 1;
                        if self.has_room(y) {
                            end = Some(y);
                            break 'search;
                        }
                        queue.push_back(y);
                    }
                }
                // Every node is reached: scanning more of x's shards finds nothing new.
                if visited == n {
                    break;
                }
            }
        }
        let Some(mut cur) = end else {
            return false;
        };
        while let Some((t, from)) = parent[cur as usize] {
            if from == NONE {
                self.put(t, cur);
                break;
            }
            self.take(t, from);
            self.put(t, cur);
            cur = from;
        }
        true
    }
}
