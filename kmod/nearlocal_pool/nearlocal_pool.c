// SPDX-License-Identifier: GPL-2.0
/*
 * nearlocal_pool: map one physical range that no driver holds write-back (a device-dax range
 * the operator unbound from device_dax, a CXL region's range, a reserved phys: range) into user
 * space with the memory type asked: uncached, write-combining or write-back.
 *
 * Why: on x86, an uncached or write-combining mapping of memory needs a PAT memory type the
 * kernel tracks for the range; /dev/mem cannot give one while device-dax holds the range
 * write-back, and device-dax always maps write-back. remap_pfn_range() with
 * pgprot_noncached() / pgprot_writecombine() reserves the type (track_pfn_remap, pfnmap_track
 * in newer kernels), so /sys/kernel/debug/x86/pat_memtype_list reads back what was asked, and
 * the reservation is dropped when the last mapping goes.
 *
 * Loaded only by the operator:
 *   insmod nearlocal_pool.ko start=0x1080000000 size=0x400000000
 * It refuses, with one line in dmesg and an errno, a size of 0, a range not page aligned or
 * wrapping, a range that intersects System RAM (-EPERM) and a range another driver holds
 * (-EBUSY). It exposes /dev/nearlocal-pool0; the mmap offset selects the type:
 *   [0, 1 << 46)                 write-back        (NEARLOCAL_POOL_WB)
 *   [1 << 46, 2 << 46)           uncached          (pgprot_noncached: PAT "uncached")
 *   [2 << 46, 3 << 46)           write-combining   (pgprot_writecombine)
 * each window's offset within it being the byte offset into the range. An offset past the third
 * window is -EINVAL (a type the module does not know), a window past the range's end -ENXIO,
 * a private mapping -EINVAL; opening the device needs CAP_SYS_RAWIO (-EPERM).
 * /sys/class/misc/nearlocal-pool0/ has start, size, mappings (live mappings) and windows.
 * Every open file holds a module reference and every mapping holds its file, so rmmod is
 * refused while anything is mapped.
 */

#include <linux/fs.h>
#include <linux/io.h>
#include <linux/ioport.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/sysfs.h>

#define NEARLOCAL_POOL_NAME "nearlocal-pool0"
#define NEARLOCAL_POOL_WINDOW_SHIFT 46
#define NEARLOCAL_POOL_WINDOW_PAGES (1UL << (NEARLOCAL_POOL_WINDOW_SHIFT - PAGE_SHIFT))

enum nearlocal_pool_type {
	NEARLOCAL_POOL_WB,
	NEARLOCAL_POOL_UC,
	NEARLOCAL_POOL_WC,
	NEARLOCAL_POOL_TYPES,
};

static const char *const nearlocal_pool_type_names[NEARLOCAL_POOL_TYPES] = { "wb", "uc", "wc" };

static unsigned long start;
module_param(start, ulong, 0444);
MODULE_PARM_DESC(start, "physical start of the range (page aligned)");

static unsigned long size;
module_param(size, ulong, 0444);
MODULE_PARM_DESC(size, "bytes in the range (page aligned, more than 0)");

static struct resource *nearlocal_pool_held;
static atomic_t nearlocal_pool_mappings = ATOMIC_INIT(0);

static void nearlocal_pool_vma_open(struct vm_area_struct *vma)
{
	atomic_inc(&nearlocal_pool_mappings);
}

static void nearlocal_pool_vma_close(struct vm_area_struct *vma)
{
	atomic_dec(&nearlocal_pool_mappings);
}

static const struct vm_operations_struct nearlocal_pool_vm_ops = {
	.open = nearlocal_pool_vma_open,
	.close = nearlocal_pool_vma_close,
};

static int nearlocal_pool_mmap(struct file *file, struct vm_area_struct *vma)
{
	unsigned long window = vma->vm_pgoff / NEARLOCAL_POOL_WINDOW_PAGES;
	unsigned long first = vma->vm_pgoff % NEARLOCAL_POOL_WINDOW_PAGES;
	unsigned long pages = vma_pages(vma);
	pgprot_t prot = vma->vm_page_prot;
	int err;

	if (window >= NEARLOCAL_POOL_TYPES)
		return -EINVAL;
	/* VM_MAYSHARE: a MAP_SHARED mapping of a read-only open has no VM_SHARED */
	if (!(vma->vm_flags & VM_MAYSHARE))
		return -EINVAL;
	if (first >= (size >> PAGE_SHIFT) || pages > (size >> PAGE_SHIFT) - first)
		return -ENXIO;
	if (window == NEARLOCAL_POOL_UC)
		prot = pgprot_noncached(prot);
	else if (window == NEARLOCAL_POOL_WC)
		prot = pgprot_writecombine(prot);
	/*
	 * remap_pfn_range() reserves the PAT type of the whole range for this mapping and sets
	 * VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP; where the range already holds another
	 * type, x86 may map it with that one instead: nearlocal reads the type back from
	 * pat_memtype_list and fails the row naming both.
	 */
	err = remap_pfn_range(vma, vma->vm_start, (start >> PAGE_SHIFT) + first,
			      pages << PAGE_SHIFT, prot);
	if (err)
		return err;
	vma->vm_ops = &nearlocal_pool_vm_ops;
	nearlocal_pool_vma_open(vma);
	return 0;
}

static int nearlocal_pool_open(struct inode *inode, struct file *file)
{
	if (!capable(CAP_SYS_RAWIO))
		return -EPERM;
	return 0;
}

static const struct file_operations nearlocal_pool_fops = {
	.owner = THIS_MODULE,
	.open = nearlocal_pool_open,
	.mmap = nearlocal_pool_mmap,
	.llseek = noop_llseek,
};

static ssize_t start_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%#lx\n", start);
}
static DEVICE_ATTR_RO(start);

static ssize_t size_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%#lx\n", size);
}
static DEVICE_ATTR_RO(size);

static ssize_t mappings_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%d\n", atomic_read(&nearlocal_pool_mappings));
}
static DEVICE_ATTR_RO(mappings);

static ssize_t windows_show(struct device *dev, struct device_attribute *attr, char *buf)
{
	int type, len = 0;

	for (type = 0; type < NEARLOCAL_POOL_TYPES; type++)
		len += sysfs_emit_at(buf, len, "%s %#lx\n", nearlocal_pool_type_names[type],
				     (unsigned long)type << NEARLOCAL_POOL_WINDOW_SHIFT);
	return len;
}
static DEVICE_ATTR_RO(windows);

static struct attribute *nearlocal_pool_attrs[] = {
	&dev_attr_start.attr,
	&dev_attr_size.attr,
	&dev_attr_mappings.attr,
	&dev_attr_windows.attr,
	NULL,
};
ATTRIBUTE_GROUPS(nearlocal_pool);

static struct miscdevice nearlocal_pool_device = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = NEARLOCAL_POOL_NAME,
	.fops = &nearlocal_pool_fops,
	.groups = nearlocal_pool_groups,
	.mode = 0600,
};

static int __init nearlocal_pool_init(void)
{
	int err;

	if (!size || (start | size) & ~PAGE_MASK || start + size - 1 < start) {
		pr_err("nearlocal_pool: start=%#lx size=%#lx: the range must be page aligned, more than 0 bytes and not wrap\n",
		       start, size);
		return -EINVAL;
	}
	if (region_intersects(start, size, IORESOURCE_SYSTEM_RAM, IORES_DESC_NONE) != REGION_DISJOINT) {
		pr_err("nearlocal_pool: [mem %#lx-%#lx] overlaps System RAM: refused\n",
		       start, start + size - 1);
		return -EPERM;
	}
	nearlocal_pool_held = request_mem_region(start, size, "nearlocal_pool");
	if (!nearlocal_pool_held) {
		pr_err("nearlocal_pool: [mem %#lx-%#lx] is held by another driver (see /proc/iomem): refused\n",
		       start, start + size - 1);
		return -EBUSY;
	}
	err = misc_register(&nearlocal_pool_device);
	if (err) {
		release_mem_region(start, size);
		return err;
	}
	pr_info("nearlocal_pool: /dev/%s maps [mem %#lx-%#lx] wb, uc or wc\n", NEARLOCAL_POOL_NAME,
		start, start + size - 1);
	return 0;
}

static void __exit nearlocal_pool_exit(void)
{
	misc_deregister(&nearlocal_pool_device);
	release_mem_region(start, size);
}

module_init(nearlocal_pool_init);
module_exit(nearlocal_pool_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("nearlocal: map a memory pool's physical range uncached, write-combining or write-back");
