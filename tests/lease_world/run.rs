//! The world's event loop and its checks.

use super::*;

impl World {
    /// A world of `names.len()` hosts, none started; clocks drawn from the
    /// seed within the drift budget.
    pub fn new(setup: Setup, names: &[&str]) -> World {
        let mut rng = Rng::new(setup.seed);
        let ppm = setup.max_ppm();
        let hosts = names
            .iter()
            .map(|name| {
                let rate = rng.between(0, 2 * ppm) as i64 - ppm as i64;
                let origin = rng.between(0, 1_000_000_000) as i128;
                Host {
                    name: name.to_string(),
                    policy: None,
                    incarnation: 0,
                    clock: Clock::new(Time::ZERO, origin, rate),
                    paused_until: Time::ZERO,
                    cut_until: Time::ZERO,
                    writable: BTreeMap::new(),
                    writes: BTreeMap::new(),
                    next_write: 0,
                    wake_gen: 0,
                    waiting: BTreeSet::new(),
                    first_heartbeat: None,
                }
            })
            .collect();
        let mut store = Store::new();
        store.renew_needs_live = rng.percent(50);
        World {
            setup,
            t: Time::ZERO,
            store,
            hosts,
            queue: BinaryHeap::new(),
            seq: 0,
            rng,
            loss: 0,
            slow: Duration::ZERO,
            store_down_until: Time::ZERO,
            snapshot: None,
            rolled_back: None,
            log: Vec::new(),
            violations: Vec::new(),
            granted: BTreeMap::new(),
            granted_at: BTreeMap::new(),
            installs: BTreeMap::new(),
            committed: BTreeMap::new(),
            commits: 0,
            stale: 0,
            writes_started: 0,
            long_pauses: 0,
            long_pauses_with_writes_open: 0,
        }
    }

    pub fn at(&mut self, at: Time, action: Action) {
        self.push(at, Ev::Do(action));
    }

    fn push(&mut self, at: Time, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Entry {
            at: at.max(self.t),
            seq: self.seq,
            ev,
        }));
    }

    /// Runs every event up to and including `until`.
    pub fn run_until(&mut self, until: Time) {
        while let Some(Reverse(next)) = self.queue.peek() {
            if next.at > until {
                break;
            }
            let Reverse(Entry { at, ev, .. }) = self.queue.pop().unwrap();
            self.t = at;
            self.step(ev);
        }
        self.t = self.t.max(until);
    }

    /// Runs until `done` holds (checked after every event) or `until`;
    /// returns when it first held.
    pub fn run_while(&mut self, until: Time, mut done: impl FnMut(&World) -> bool) -> Option<Time> {
        loop {
            if done(self) {
                return Some(self.t);
            }
            let Reverse(next) = self.queue.peek()?;
            if next.at > until {
                self.t = until;
                return None;
            }
            let Reverse(Entry { at, ev, .. }) = self.queue.pop().unwrap();
            self.t = at;
            self.step(ev);
        }
    }

    /// Sets a host's clock rate error, in ppm (within `max_ppm` to stay in
    /// the drift budget).
    pub fn skew(&mut self, host: usize, ppm: i64) {
        let t = self.t;
        let c = &mut self.hosts[host].clock;
        *c = Clock::new(t, c.raw(t), ppm);
    }

    pub fn local(&self, host: usize) -> Time {
        self.hosts[host].clock.local(self.t)
    }

    fn step(&mut self, ev: Ev) {
        if let Some((host, inc)) = ev.host() {
            let h = &self.hosts[host];
            if h.incarnation != inc || h.policy.is_none() {
                return;
            }
            if h.paused_until > self.t {
                let resume = h.paused_until;
                self.push(resume, ev);
                return;
            }
        }
        match ev {
            Ev::Arrive { host, inc, req } => self.arrive(host, inc, req),
            Ev::Answer {
                host, id, result, ..
            } => self.answer(host, id, result),
            Ev::Wake { host, gen, .. } => {
                if self.hosts[host].wake_gen == gen {
                    let now = self.local(host);
                    self.policy(host).handle_timeout(now);
                    self.drain(host);
                }
            }
            Ev::StmtTimeout { host, id, .. } => {
                if self.hosts[host].waiting.remove(&id) {
                    self.hand_back(host, id, Err(StoreError::Unknown));
                }
            }
            Ev::WriteTry { host, inc } => self.write_try(host, inc),
            Ev::WriteEnd { host, write, .. } => self.write_end(host, write),
            Ev::Do(action) => self.act(action),
        }
    }

    pub fn policy(&mut self, host: usize) -> &mut LeasePolicy {
        self.hosts[host].policy.as_mut().expect("host is up")
    }

    /// After any input: send what the policy asks, record its events, arm
    /// its timer.
    fn drain(&mut self, host: usize) {
        let now = self.local(host);
        while let Some(req) = self.policy(host).poll_request(now) {
            self.send(host, req);
        }
        while let Some(event) = self.policy(host).poll_event() {
            let h = &mut self.hosts[host];
            match event {
                LeaseEvent::Writable { partition, epoch } => {
                    h.writable.insert(partition, epoch);
                }
                LeaseEvent::Stopped { partition, .. } => {
                    h.writable.remove(&partition);
                }
                _ => {}
            }
            self.log.push(Record::Event {
                t: self.t,
                host,
                event,
            });
        }
        if let Some(to) = self.hosts[host].policy.as_ref().unwrap().poll_timeout() {
            let h = &mut self.hosts[host];
            h.wake_gen += 1;
            let (gen, inc) = (h.wake_gen, h.incarnation);
            let at = h.clock.real_at(self.t, to);
            self.push(at, Ev::Wake { host, inc, gen });
        }
    }

    fn delay(&mut self) -> Duration {
        let d = self.rng.duration(self.setup.delay);
        d + self.slow
    }

    fn send(&mut self, host: usize, req: Request) {
        let (inc, cut) = {
            let h = &mut self.hosts[host];
            if matches!(req.op, StoreOp::Heartbeat { .. }) && h.first_heartbeat.is_none() {
                h.first_heartbeat = Some(self.t);
            }
            h.waiting.insert(req.id);
            (h.incarnation, h.cut_until > self.t)
        };
        let timeout_local = self.local(host) + self.setup.stmt_timeout;
        let at = self.hosts[host].clock.real_at(self.t, timeout_local);
        let id = req.id;
        self.push(at, Ev::StmtTimeout { host, inc, id });
        if cut || self.rng.percent(self.loss) {
            return;
        }
        let d = self.delay();
        self.push(self.t + d, Ev::Arrive { host, inc, req });
    }

    fn arrive(&mut self, host: usize, inc: u64, req: Request) {
        if self.store_down_until > self.t {
            if self.rng.percent(50) {
                let d = self.delay();
                let result = Err(StoreError::Failed);
                self.push(
                    self.t + d,
                    Ev::Answer {
                        host,
                        inc,
                        id: req.id,
                        result,
                    },
                );
            }
            return;
        }
        let reply = self.store.run(self.t, &req.op);
        self.check_store(&req.op, &reply);
        if self.rng.percent(self.loss) {
            return;
        }
        let d = self.delay();
        let result = Ok(reply);
        self.push(
            self.t + d,
            Ev::Answer {
                host,
                inc,
                id: req.id,
                result,
            },
        );
    }

    fn answer(&mut self, host: usize, id: RequestId, result: Result<Reply, StoreError>) {
        if self.hosts[host].cut_until > self.t || !self.hosts[host].waiting.remove(&id) {
            return;
        }
        self.hand_back(host, id, result);
    }

    fn hand_back(&mut self, host: usize, id: RequestId, result: Result<Reply, StoreError>) {
        let now = self.local(host);
        match self.policy(host).handle_reply(now, id, result) {
            Ok(()) | Err(ReplyError::Unknown(_)) => {}
            Err(e) => self
                .violations
                .push(format!("{}: {e}", self.hosts[host].name)),
        }
        self.drain(host);
    }

    /// Epochs only grow (S-L10, S-L11): every grant is above every earlier
    /// grant of its partition and the sink's epoch (unless the lease table
    /// was rolled back), and an epoch is installed for one holder only.
    fn check_store(&mut self, op: &StoreOp, reply: &Reply) {
        if let (
            StoreOp::Install {
                partition,
                epoch,
                holder,
            },
            Reply::Installed { ours: true, .. },
        ) = (op, reply)
        {
            let first = self
                .installs
                .entry((*partition, epoch.0))
                .or_insert_with(|| holder.clone());
            if first != holder {
                self.violations.push(format!(
                    "{}: {partition} {epoch} installed for {holder:?} after {first:?}",
                    self.t
                ));
            }
        }
        if let (StoreOp::Acquire { .. }, Reply::Acquired { granted }) = (op, reply) {
            for &(p, e) in granted {
                let before = self.granted.get(&p).copied().unwrap_or(0);
                let sink = self.store.sink.get(&p).map_or(0, |r| r.epoch);
                // After a rollback the lease table may hand an epoch out
                // again; the sink's install keeps it to one holder.
                if self.rolled_back.is_none() && (e.0 <= sink || e.0 <= before) {
                    self.violations.push(format!(
                        "{}: {p} granted {e}, not above {before} granted or {sink} at the sink",
                        self.t
                    ));
                }
                self.granted.insert(p, before.max(e.0));
                let owner = match op {
                    StoreOp::Acquire { instance, .. } => instance.to_string(),
                    _ => unreachable!(),
                };
                self.granted_at.entry((p, e.0, owner)).or_insert(self.t);
            }
        }
    }

    fn write_try(&mut self, host: usize, inc: u64) {
        let gap = self.rng.duration(self.setup.write_gap);
        self.push(self.t + gap, Ev::WriteTry { host, inc });
        let p = {
            let h = &self.hosts[host];
            let held: Vec<Partition> = h.writable.keys().copied().collect();
            if !held.is_empty() && self.rng.clone().percent(90) {
                held[(self.rng.next() % held.len() as u64) as usize]
            } else {
                Partition((self.rng.next() % u64::from(self.setup.partitions)) as u32)
            }
        };
        let _ = self.rng.next();
        let now = self.local(host);
        let grant = self.policy(host).begin_write(now, p);
        if let Ok(grant) = grant {
            self.check_write_start(host, &grant);
            self.writes_started += 1;
            self.log.push(Record::Write {
                t: self.t,
                host,
                partition: grant.partition,
                epoch: grant.epoch,
            });
            let h = &mut self.hosts[host];
            let n = h.next_write;
            h.next_write += 1;
            h.writes.insert(n, grant);
            let len = self.rng.duration(self.setup.write_len);
            self.push(
                self.t + len,
                Ev::WriteEnd {
                    host,
                    inc,
                    write: n,
                },
            );
        }
        self.drain(host);
    }

    /// S-L8, S-L12: a write starts only under a lease the store takes for
    /// live, on its own clock, and under the epoch installed at the sink
    /// for this holder. A lease granted before the lease table was rolled
    /// back is exempt: the failover took the store's memory of it (S-L11);
    /// the sink's check at commit still fences its writes.
    fn check_write_start(&mut self, host: usize, grant: &WriteGrant) {
        let h = &self.hosts[host];
        let (p, e) = (grant.partition, grant.epoch);
        let granted = self.granted_at.get(&(p, e.0, h.name.clone())).copied();
        if let (Some(r), Some(g)) = (self.rolled_back, granted) {
            if g <= r {
                return;
            }
        }
        if !self.store.live(self.t, p, &h.name, e) {
            let row = self.store.tables.leases.get(&p);
            let now = self.store.now(self.t);
            self.violations.push(format!(
                "{}: {} started a write of {p} under {e}, which the store takes for expired (store clock {now}, row {row:?})",
                self.t, h.name
            ));
        }
        let holder = Holder {
            instance: InstanceId::new(h.name.clone()).unwrap(),
            incarnation: h.incarnation,
        };
        let installed = self.store.sink.get(&p);
        if installed.is_none_or(|r| r.epoch != e.0 || r.holder != holder) {
            self.violations.push(format!(
                "{}: {} started a write of {p} under {e}, not installed for it at the sink ({installed:?})",
                self.t, h.name
            ));
        }
    }

    /// The sink checks the epoch as the last statement before COMMIT
    /// (S-L14).
    fn write_end(&mut self, host: usize, write: u64) {
        let Some(grant) = self.hosts[host].writes.remove(&write) else {
            return;
        };
        let (p, e) = (grant.partition, grant.epoch);
        let current = self.store.sink.get(&p).map_or(0, |r| r.epoch);
        let now = self.local(host);
        if current == e.0 {
            let last = self.committed.entry(p).or_insert(0);
            if e.0 < *last {
                self.violations.push(format!(
                    "{}: a write of {p} under {e} committed after e{last}",
                    self.t
                ));
            }
            *last = e.0;
            self.commits += 1;
        } else {
            self.stale += 1;
            self.policy(host).handle_stale_epoch(now, p, e);
        }
        self.policy(host).end_write(now, grant);
        self.drain(host);
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::Start(host) => self.start(host),
            Action::Crash(host) => {
                let h = &mut self.hosts[host];
                h.policy = None;
                h.writable.clear();
                h.writes.clear();
                h.waiting.clear();
            }
            Action::Shutdown(host, departure) => {
                if self.hosts[host].policy.is_some() {
                    let now = self.local(host);
                    self.policy(host).shutdown(now, departure);
                    self.drain(host);
                }
            }
            Action::Pause(host, d) => {
                if d > self.setup.ttl && self.hosts[host].up() {
                    self.long_pauses += 1;
                    self.long_pauses_with_writes_open +=
                        u64::from(!self.hosts[host].writes.is_empty());
                }
                let h = &mut self.hosts[host];
                h.paused_until = h.paused_until.max(self.t + d);
            }
            Action::CutOff(host, d) => {
                let h = &mut self.hosts[host];
                h.cut_until = h.cut_until.max(self.t + d);
            }
            Action::StoreDown(d) => self.store_down_until = self.store_down_until.max(self.t + d),
            Action::Loss(pct) => self.loss = pct,
            Action::Slow(d) => self.slow = d,
            Action::Step(None, delta) => self.store.clock.step(self.t, delta),
            Action::Step(Some(host), delta) => self.hosts[host].clock.step(self.t, delta),
            Action::Snapshot => self.snapshot = Some(self.store.tables.clone()),
            Action::Rollback => {
                if let Some(tables) = self.snapshot.take() {
                    self.store.tables = tables;
                    self.rolled_back = Some(self.t);
                }
            }
        }
    }

    fn start(&mut self, host: usize) {
        let now = self.local(host);
        let h = &mut self.hosts[host];
        h.incarnation += 1;
        h.writable.clear();
        h.writes.clear();
        h.waiting.clear();
        h.first_heartbeat = None;
        h.paused_until = Time::ZERO;
        let config = self.setup.config(&h.name, h.incarnation);
        h.policy = Some(LeasePolicy::new(config, now));
        let inc = h.incarnation;
        let gap = self.rng.duration(self.setup.write_gap);
        self.push(self.t + gap, Ev::WriteTry { host, inc });
        self.drain(host);
    }

    /// Every partition writable at exactly one up host, each up host
    /// writing exactly its share, the shares balanced to within one.
    pub fn converged(&self) -> Result<(), String> {
        let up: Vec<usize> = (0..self.hosts.len())
            .filter(|&h| self.hosts[h].up() && self.hosts[h].paused_until <= self.t)
            .collect();
        let mut holders: BTreeMap<Partition, Vec<usize>> = BTreeMap::new();
        for &h in &up {
            for &p in self.hosts[h].writable.keys() {
                holders.entry(p).or_default().push(h);
            }
        }
        for p in (0..self.setup.partitions).map(Partition) {
            let hs = holders.get(&p).map_or(&[][..], |v| &v[..]);
            if hs.len() != 1 {
                return Err(format!("{p} writable at {hs:?}"));
            }
        }
        let sizes: Vec<usize> = up.iter().map(|&h| self.hosts[h].writable.len()).collect();
        for &h in &up {
            let share = self.hosts[h].policy.as_ref().unwrap().share();
            let writable: BTreeSet<Partition> = self.hosts[h].writable.keys().copied().collect();
            if &writable != share {
                return Err(format!(
                    "{} writes {writable:?}, its share is {share:?}",
                    self.hosts[h].name
                ));
            }
        }
        let (lo, hi) = (sizes.iter().min(), sizes.iter().max());
        if let (Some(lo), Some(hi)) = (lo, hi) {
            if hi - lo > 1 {
                return Err(format!("shares {sizes:?} are not balanced"));
            }
        }
        Ok(())
    }

    /// The plan the store's tables give now, for the members it takes for
    /// live.
    pub fn store_plan(&self) -> Plan {
        let now = self.store.now(self.t);
        let members = self
            .store
            .tables
            .members
            .iter()
            .filter(|(_, &e)| e > now)
            .map(|(m, _)| InstanceId::new(m.clone()).unwrap());
        let owners = self
            .store
            .tables
            .leases
            .iter()
            .map(|(&p, r)| (p, InstanceId::new(r.owner.clone()).unwrap()));
        Plan::new(self.setup.partitions, members, owners)
    }

    /// How many `Stopped` events the log holds for `cause`.
    pub fn stops(&self, cause: StopCause) -> usize {
        self.log
            .iter()
            .filter(|r| matches!(r, Record::Event { event: LeaseEvent::Stopped { cause: c, .. }, .. } if *c == cause))
            .count()
    }

    /// How many handovers (`Released` events) the log holds.
    pub fn handovers(&self) -> usize {
        self.log
            .iter()
            .filter(|r| {
                matches!(
                    r,
                    Record::Event {
                        event: LeaseEvent::Released { .. },
                        ..
                    }
                )
            })
            .count()
    }

    /// The writes of `host` in flight.
    pub fn writes_in_flight(&self, host: usize) -> usize {
        self.hosts[host].writes.len()
    }

    /// The writable partitions of `host`.
    pub fn writable(&self, host: usize) -> BTreeSet<Partition> {
        self.hosts[host].writable.keys().copied().collect()
    }

    /// Who writes `p`: its holder in the world's view.
    pub fn writer_of(&self, p: Partition) -> Vec<usize> {
        (0..self.hosts.len())
            .filter(|&h| self.hosts[h].up() && self.hosts[h].writable.contains_key(&p))
            .collect()
    }
}
