use super::*;

/// xorshift64: the same cases on every run, many of them.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// A value a training could log, or one a codec could get wrong.
    fn value(&mut self) -> f64 {
        match self.below(12) {
            0 => f64::from_bits(self.next()), // any bits: NaN payloads, subnormals
            1 => f64::from_bits(0x7ff0_0000_0000_0000 | (self.next() & ((1 << 52) - 1)) | 1),
            2 => f64::from_bits(self.next() & ((1 << 52) - 1)), // subnormal or zero
            3 => [
                0.0,
                -0.0,
                f64::INFINITY,
                f64::NEG_INFINITY,
                f64::NAN,
                -f64::NAN,
            ][self.below(6) as usize],
            4 => f64::from(f32::from_bits(self.next() as u32)), // f32 (NaN payloads too)
            5 => f64::from(f32::MIN_POSITIVE) / 4.0,            // f32 subnormal
            6 => f64::MIN_POSITIVE / 8.0,
            7 => 1e-4,
            _ => (self.below(1000) as f64) * 0.001,
        }
    }
}

fn same_bits(a: &[StepRecord], b: &[StepRecord]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.step, y.step);
        assert_eq!(x.wall_time.to_bits(), y.wall_time.to_bits());
        let mut xv: Vec<(u32, u64)> = x.values.iter().map(|(i, v)| (i.0, v.to_bits())).collect();
        xv.sort_unstable();
        let yv: Vec<(u32, u64)> = y.values.iter().map(|(i, v)| (i.0, v.to_bits())).collect();
        assert_eq!(
            xv, yv,
            "step {} (a record's values come back in id order)",
            x.step
        );
    }
}

fn random_batches(rng: &mut Rng) -> Vec<Vec<StepRecord>> {
    let n_batches = 1 + rng.below(20) as usize;
    let metrics = 1 + rng.below(6) as u32;
    let mut step = rng.next() as i64 >> rng.below(64);
    (0..n_batches)
        .map(|_| {
            (0..rng.below(8))
                .map(|_| {
                    // Steps mostly climb, sometimes go back (a resume) or jump far.
                    step = match rng.below(10) {
                        0 => step.wrapping_sub(rng.below(100) as i64),
                        1 => rng.next() as i64,
                        _ => step.wrapping_add(1),
                    };
                    let mut ids: Vec<u32> = (0..metrics).filter(|_| rng.below(4) != 0).collect();
                    // Unordered within the record: they come back sorted.
                    if rng.below(2) == 0 {
                        ids.reverse();
                    }
                    StepRecord {
                        step,
                        wall_time: rng.value(),
                        values: ids
                            .into_iter()
                            .map(|i| (MetricId(i * 7), rng.value()))
                            .collect(),
                    }
                })
                .collect()
        })
        .collect()
}

#[test]
fn every_pack_round_trips_bit_exactly() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for case in 0..3_000 {
        let batches = random_batches(&mut rng);
        let first = rng.next() >> 2;
        let blob = encode_pack(first, &batches);
        assert!(is_pack(&blob));
        let back = decode_pack(&blob).unwrap_or_else(|| panic!("case {case} does not decode"));
        assert_eq!(back.first_seq, first);
        let got: Vec<(u64, &[StepRecord])> = back.batches().collect();
        assert_eq!(got.len(), batches.len(), "case {case}");
        for (i, ((seq, records), want)) in got.into_iter().zip(&batches).enumerate() {
            assert_eq!(seq, first + i as u64);
            same_bits(want, records);
        }
    }
}

#[test]
fn narrowing_keeps_every_f32_and_nan_payload_and_refuses_the_rest() {
    let mut rng = Rng(7);
    for _ in 0..100_000 {
        let v = f64::from_bits(rng.next());
        if let Some(n) = narrow(v) {
            assert_eq!(widen(n).to_bits(), v.to_bits(), "{:x}", v.to_bits());
        }
        let f = f32::from_bits(rng.next() as u32);
        assert_eq!(narrow(widen(f)).map(f32::to_bits), Some(f.to_bits()));
    }
    assert!(narrow(0.1).is_none());
    assert_eq!(narrow(-0.0).map(f32::to_bits), Some((-0.0f32).to_bits()));
}

#[test]
fn a_damaged_pack_is_refused_not_misread() {
    let mut rng = Rng(3);
    let batches = random_batches(&mut rng);
    let blob = encode_pack(5, &batches);
    for cut in 0..blob.len() {
        assert!(decode_pack(&blob[..cut]).is_none(), "cut at {cut}");
    }
    let mut longer = blob.clone();
    longer.push(0);
    assert!(decode_pack(&longer).is_none());
    // A count that claims more records than there are.
    let mut lying = vec![PACK_VERSION, 0, 1];
    put_varint(&mut lying, u64::from(u32::MAX));
    assert!(decode_pack(&lying).is_none());
}

#[test]
fn empty_batches_keep_their_sequence_numbers() {
    let batches = vec![
        vec![],
        vec![crate::store::blob::test_record(4, 1.5)],
        vec![],
    ];
    let back = decode_pack(&encode_pack(10, &batches)).unwrap();
    let got: Vec<(u64, usize)> = back.batches().map(|(s, r)| (s, r.len())).collect();
    assert_eq!(got, vec![(10, 0), (11, 1), (12, 0)]);
}

#[test]
fn visiting_values_sees_what_decoding_sees_for_every_window() {
    let mut rng = Rng(11);
    for _ in 0..500 {
        let batches = random_batches(&mut rng);
        let first = 1 + rng.below(1000);
        let blob = encode_pack(first, &batches);
        let decoded = decode_pack(&blob).unwrap();
        let after = first + rng.below(25) - 2.min(first);
        let through = [after + rng.below(25), u64::MAX][rng.below(2) as usize];
        let mut want: Vec<(u32, i64, u64, u64)> = decoded
            .batches()
            .filter(|(s, _)| *s > after && *s <= through)
            .flat_map(|(_, r)| r.iter())
            .flat_map(|r| {
                r.values
                    .iter()
                    .map(|(id, v)| (id.0, r.step, r.wall_time.to_bits(), v.to_bits()))
            })
            .collect();
        let mut got = Vec::new();
        visit_pack_values(&blob, (after, through), |s, t, id, v| {
            got.push((id.0, s, t.to_bits(), v.to_bits()))
        })
        .unwrap();
        // Metric by metric, each in record order: the same values per metric, in order.
        want.sort_by_key(|w| w.0);
        assert_eq!(got, want, "after {after} through {through}");
    }
}
