/* NV's fast launch in machine code: the resident-launch path of plugrt_nv.device (NVProgram._submitters) without the
 * Python. plugrt_nv/fastlaunch_x86_64.py holds what this compiles to (gen/fastlaunch.py writes it); plugrt_nv.fastlaunch
 * lays out the same structs with ctypes.
 *
 * A launch is declined (0 returned: the Python path takes it, and may wait) when the device may not take the fast path,
 * when the resident entry was rewritten since the call was prepared, or when the next command slot is still in use.
 * Otherwise: the entry's 12 command words into the slot (unless it holds them already), the release's payload, a GPFIFO
 * entry, and with `publish` a store fence, GP_PUT and the doorbell; the launch's timeline value is returned. */
#include <stdint.h>

struct state {                 /* one per device; every field is 8 bytes */
  uint64_t value;              /* the timeline value last submitted */
  uint64_t put;                /* the compute ring's put counter (entries ever written) */
  uint64_t next;               /* the command slot the next submission takes */
  uint64_t fast;               /* nonzero while a launch may take the fast path */
  uint64_t counter;            /* address of the 32-bit timeline counter the GPU writes */
  uint64_t ring;               /* address of the GPFIFO entries */
  uint64_t ring_mask;          /* entries - 1 (a power of two) */
  uint64_t put_register;       /* address of GP_PUT (32 bits) */
  uint64_t doorbell;           /* address of the doorbell (32 bits) */
  uint64_t token;              /* what the doorbell takes */
  uint64_t slots;              /* address of the command slots */
  uint64_t slot_size;
  uint64_t slot_mask;          /* slots - 1 (a power of two) */
  uint64_t last_use;           /* address of uint64[slots]: each slot's last timeline value */
  uint64_t holds;              /* address of uint64[slots]: the entry generation whose words each slot holds, 0 none */
  uint64_t gp_entries;         /* address of uint64[slots]: each slot's fast-path GPFIFO entry */
  uint64_t payload;            /* byte offset of the release's payload in the words */
  uint64_t busy;               /* nonzero while a thread holds the device's lock (plugrt_nv.fastlaunch.DeviceLock) */
};

struct entry {                 /* one resident launch */
  uint64_t generation;         /* changes whenever the entry is (re)written: never 0, never reused */
  uint64_t last_use;
  uint64_t words[6];           /* the fast path's 12 command words */
};

struct call { struct state *st; struct entry *e; uint64_t generation; };

static inline uint64_t launch(const struct call *c, int publish) {
  struct state *st = c->st;
  struct entry *e = c->e;
  if (!st->fast || e->generation != c->generation) return 0;
  uint64_t i = st->next, value = st->value;
  uint64_t done = value - (uint32_t)(value - *(volatile uint32_t *)st->counter);
  uint64_t *last_use = (uint64_t *)st->last_use, *holds = (uint64_t *)st->holds;
  if (last_use[i] > done) return 0;
  volatile uint8_t *slot = (volatile uint8_t *)(st->slots + i * st->slot_size);
  value += 1;
  if (holds[i] != c->generation) {
    volatile uint64_t *w = (volatile uint64_t *)slot;
    for (int k = 0; k < 6; k++) w[k] = e->words[k];
    holds[i] = c->generation;
  }
  *(volatile uint32_t *)(slot + st->payload) = (uint32_t)value;
  uint64_t put = st->put;
  ((volatile uint64_t *)st->ring)[put & st->ring_mask] = ((uint64_t *)st->gp_entries)[i];
  st->put = put + 1;
  st->next = (i + 1) & st->slot_mask;
  st->value = last_use[i] = e->last_use = value;
  if (publish) {
    /* the slot and the ring entry reach the GPU before GP_PUT (write-combined stores: see NVState._kick) */
    __asm__ volatile("sfence" ::: "memory");
    *(volatile uint32_t *)st->put_register = (uint32_t)((put + 1) & st->ring_mask);
    *(volatile uint32_t *)st->doorbell = (uint32_t)st->token;
  }
  return value;
}

/* under the device's lock */
uint64_t plugrt_nv_submit(const struct call *c) { return launch(c, 1); }
uint64_t plugrt_nv_queue(const struct call *c) { return launch(c, 0); }

/* without it: called with the GIL held, so no other thread runs meanwhile; one that holds the lock may be in the
 * middle of changing what this reads, so then it declines */
uint64_t plugrt_nv_submit_unlocked(const struct call *c) { return c->st->busy ? 0 : launch(c, 1); }
