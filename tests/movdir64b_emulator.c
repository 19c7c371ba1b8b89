/* movdir64b on a CPU without it (tests/test_kernels.py): a SIGILL handler that decodes the
 * instruction at the faulting address, does what it does (64 bytes from the memory operand to
 * the 64-byte aligned address in the register operand), logs both addresses and steps past it.
 * Any other illegal instruction, or a misaligned destination (the real one faults: #GP), is
 * counted and the process stops as it would have.
 *
 * Built by the test with `cc -shared -fPIC`; x86-64 Linux only. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

#define LOG_SIZE (1 << 16)

static uint64_t logged_dst[LOG_SIZE], logged_src[LOG_SIZE];
static long logged, refused;

static const int GREG[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI,
                             REG_RDI, REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13,
                             REG_R14, REG_R15};

static uint64_t reg(const ucontext_t *uc, int r) { return (uint64_t)uc->uc_mcontext.gregs[GREG[r]]; }

static void stop(void) {
    refused++;
    signal(SIGILL, SIG_DFL); /* the instruction runs again and the process dies of it */
}

static void on_sigill(int sig, siginfo_t *info, void *context) {
    (void)sig;
    (void)info;
    ucontext_t *uc = context;
    const uint8_t *p = (const uint8_t *)uc->uc_mcontext.gregs[REG_RIP];
    int rex = 0;
    if (*p++ != 0x66) goto refuse;
    if ((*p & 0xF0) == 0x40) rex = *p++;
    if (p[0] != 0x0F || p[1] != 0x38 || p[2] != 0xF8) goto refuse;
    p += 3;
    uint8_t modrm = *p++;
    int mod = modrm >> 6, rm = modrm & 7;
    int dst_reg = ((modrm >> 3) & 7) | ((rex & 4) ? 8 : 0);
    if (mod == 3) goto refuse;
    uint64_t address = 0;
    if (rm == 4) { /* SIB */
        uint8_t sib = *p++;
        int scale = sib >> 6, index = ((sib >> 3) & 7) | ((rex & 2) ? 8 : 0);
        int base = (sib & 7) | ((rex & 1) ? 8 : 0);
        if ((sib & 7) == 5 && mod == 0) {
            int32_t disp;
            memcpy(&disp, p, 4);
            p += 4;
            address = (uint64_t)(int64_t)disp;
        } else {
            address = reg(uc, base);
        }
        if (index != 4) address += reg(uc, index) << scale;
    } else if (rm == 5 && mod == 0) { /* RIP-relative: from the end of this instruction */
        int32_t disp;
        memcpy(&disp, p, 4);
        p += 4;
        address = (uint64_t)p + (uint64_t)(int64_t)disp;
    } else {
        address = reg(uc, rm | ((rex & 1) ? 8 : 0));
    }
    if (mod == 1) {
        address += (uint64_t)(int64_t)(int8_t)*p++;
    } else if (mod == 2) {
        int32_t disp;
        memcpy(&disp, p, 4);
        p += 4;
        address += (uint64_t)(int64_t)disp;
    }
    uint64_t dst = reg(uc, dst_reg);
    if (dst % 64 != 0 || logged >= LOG_SIZE) goto refuse;
    memcpy((void *)dst, (const void *)address, 64);
    logged_dst[logged] = dst;
    logged_src[logged] = address;
    logged++;
    uc->uc_mcontext.gregs[REG_RIP] = (greg_t)p;
    return;
refuse:
    stop();
}

int nl_emu_install(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_sigill;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    return sigaction(SIGILL, &action, NULL);
}

long nl_emu_logged(void) { return logged; }
long nl_emu_refused(void) { return refused; }
uint64_t nl_emu_dst(long i) { return logged_dst[i]; }
uint64_t nl_emu_src(long i) { return logged_src[i]; }
